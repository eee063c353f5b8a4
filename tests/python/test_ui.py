"""The operator's page, `/ui` (issue 46, item 2), in a real browser: Debian's chromium,
headless, driven by Selenium with Debian's chromium-driver (no browser is downloaded).
The page loads with no console error and no request leaving its origin; a tenant
bursting past its limit through gRPC tops the "Most refused" table within 2 s; the
explain form answers as `shardgate explain` does; a reload that changes a limit shows,
and so does a refused reload's error. With `SHARDGATE_UI_SCREENSHOT=PATH` it saves a
screenshot of the page there (docs/ui.png was taken so).

Skipped, with the reason, when chromium, chromium-driver or Selenium is missing
(scripts/test installs them)."""
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse

import pytest

from conftest import binary
from test_independent_client import desc, request

OK, OVER = 1, 2

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

RULES = """
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100}
"""


def missing():
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(path):
            return f"{path} not found (apt-get install {package}; scripts/test does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium; scripts/test does)"
    return None


@pytest.fixture
def browser():
    reason = missing()
    if reason:
        pytest.skip(f"browser test skipped: {reason}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="shardgate-ui-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,1100"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(check, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what} not seen within {timeout} s (last: {last!r})")


def text_of(driver, css):
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css)


def first_row(driver, table):
    return driver.execute_script(
        "const r = document.querySelector(arguments[0] + ' tbody tr');"
        "return r ? Array.from(r.cells, c => c.textContent) : null;", table)


def requests_made(driver):
    """(URL, the document that made it) of every request the browser sent."""
    import json
    made = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            made.append((msg["params"]["request"]["url"], msg["params"].get("documentURL", "")))
    return made


def test_the_page_shows_who_is_limited_and_why(shardgate, browser, tmp_path):
    rules = tmp_path / "shop.yaml"
    rules.write_text(RULES)
    server = shardgate(config=rules)
    origin = f"http://127.0.0.1:{server.http_port}"
    browser.get(origin + "/ui")
    wait(lambda: (text_of(browser, "#status") or "").startswith("Updated"), 10, "a first refresh")
    assert "5/minute" in text_of(browser, "#rules tbody")
    assert f"loaded from {rules} " in text_of(browser, "#config-summary"), \
        text_of(browser, "#config-summary")

    # A burst of refused requests for one tenant, quiet tenants beside it.
    for t in ("t1", "t2"):
        server.should_rate_limit(request("shop", desc(("tenant", t))))
    codes = [server.should_rate_limit(request("shop", desc(("tenant", "noisy")))).overall_code
             for _ in range(40)]
    assert codes.count(OVER) == 35
    burst_end = time.monotonic()
    row = wait(lambda: (r := first_row(browser, "#top-refused")) and r[1] == "tenant=noisy" and r,
               2.0, "the bursting tenant at the top of the refused table")
    assert time.monotonic() - burst_end < 2.0
    assert row[0] == "shop.tenant" and row[2] == "35" and row[4] == "100.0 %", row

    # The store's calls, by outcome, with their latency (the memory store's: all "ok").
    calls = wait(lambda: first_row(browser, "#store-calls"), 5, "the store's calls")
    assert len(calls) == 5 and int(calls[2]) > 0, calls
    assert calls[3].endswith(" ms") and float(calls[3].split()[0]) > 0, calls
    assert calls[4].startswith("≤ ") and calls[4].endswith(" ms"), calls

    # The explain form answers as the CLI does (a descriptor no request touched: the
    # CLI's own store and the server's agree on it).
    browser.find_element("id", "explain-domain").send_keys("shop")
    browser.find_element("id", "explain-entries").send_keys("tenant=fresh")
    browser.find_element("css selector", "#explain-form button").click()
    answer = wait(lambda: text_of(browser, "#explain-answer"), 5, "the explain answer")
    cli = subprocess.run([binary(), "explain", "--config", str(rules), "shop", "tenant=fresh"],
                         capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    # The CLI's first line says whose store its balances are from; the rest is the answer.
    note, _, said = cli.stdout.partition("\n")
    assert note.startswith("balances: an empty embedded store"), cli.stdout
    assert answer.strip() == said.strip(), (answer, cli.stdout)

    path = os.environ.get("SHARDGATE_UI_SCREENSHOT")
    if path:
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(path)

    # A reload that changes a limit shows; a refused one shows its error.
    rules.write_text(RULES.replace("requests_per_unit: 5", "requests_per_unit: 7"))
    wait(lambda: "7/minute" in text_of(browser, "#rules tbody"), 10, "the reloaded limit")
    assert not browser.find_element("id", "rejected").is_displayed()
    rules.write_text(RULES.replace("unit: minute", "unit: fortnight"))
    wait(lambda: browser.find_element("id", "rejected").is_displayed(), 10, "the refused reload")
    assert "fortnight" in text_of(browser, "#rejected-error"), text_of(browser, "#rejected-error")
    assert f"({rules})" in text_of(browser, "#rejected-at"), text_of(browser, "#rejected-at")
    assert "7/minute" in text_of(browser, "#rules tbody"), "the previous rules stay"

    # Nothing logged to the console; every request stayed on the page's origin.
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    made = requests_made(browser)
    assert any(u.startswith(origin + "/ui/chart.svg") for u, _ in made), made
    home = urllib.parse.urlsplit(origin)[:2]
    # The page's own requests: all to its origin. The browser's (its blank start page,
    # chrome:// resources) never went on the network: no http(s) request anywhere else.
    from_page = [u for u, doc in made if doc.startswith(origin)]
    assert from_page and all(urllib.parse.urlsplit(u)[:2] == home for u in from_page), from_page
    elsewhere = [u for u, _ in made
                 if u.startswith("http") and urllib.parse.urlsplit(u)[:2] != home]
    assert elsewhere == [], elsewhere


def test_the_page_is_off_unless_the_port_is_loopback_or_asked_for(shardgate):
    on = shardgate(RULES)
    assert on.http("GET", "/ui")[0] == 200
    off = shardgate(RULES, args=["--ui", "off"])
    assert off.http("GET", "/ui")[0] == 404
    assert off.http("GET", "/top")[0] == 200, "/top stays: the HTTP port is the operator's"
