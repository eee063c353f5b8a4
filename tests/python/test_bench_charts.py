"""bench/charts.py: every committed bench result yields its charts, with the figures its
Markdown table shows; bad input fails with the file's name; the SVGs the README shows
exist. The data extraction needs no matplotlib; the drawing test is skipped without it
(bench/requirements.txt; .ci/run and bench/run install it, scripts/test does not)."""
import importlib.util
import json
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
_spec = importlib.util.spec_from_file_location("bench_charts", REPO / "bench" / "charts.py")
charts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(charts)

RESULT_FILES = sorted(RESULTS.glob("*.json"))
README = (REPO / "README.md").read_text()
# The results the README cites (as bench/results/<x>.md), whose charts it shows.
CITED = sorted({(REPO / m).with_suffix(".json") for m in re.findall(r"bench/results/[\w.-]+\.md", README)
                if (REPO / m).with_suffix(".json").is_file()})


def extracted(path):
    return {c["name"]: c for c in charts.extract(charts.load(str(path)), str(path))}


def value(chart, panel_title, series_label, group):
    p = next(p for p in chart["panels"] if p["title"] == panel_title)
    s = next(s for s in p["series"] if s["label"] == series_label)
    return s["values"][p["groups"].index(group)]


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_every_committed_result_has_its_charts(path):
    got = extracted(path)
    want = {"throughput", "cpu", "latency"} | ({"store"} if "dynamodb" in path.name else set())
    assert set(got) == want
    for chart in got.values():
        for p in chart["panels"]:
            for s in p["series"]:
                assert len(s["values"]) == len(p["groups"])
                if chart["kind"] == "ranges":
                    assert all(v is None or (len(v) == 3 and v[0] <= v[1] <= v[2]) for v in s["values"])


def test_the_figures_are_the_tables():
    mem = extracted(RESULTS / "2026-11-30-1527-memory.json")
    # README: one hot descriptor at c=64, 48.5k against 54.3k req/s, 0.89; p99 5.0 (4.7) ms
    assert round(value(mem["throughput"], "c=64", "shardgate", "hot\n(h2load)"), -2) == 48500
    assert round(value(mem["throughput"], "c=64", "no-op ceiling", "hot\n(h2load)"), -2) == 54300
    p = mem["throughput"]["panels"][-1]
    assert p["notes"][p["groups"].index("hot\n(h2load)")] == "0.89×"
    assert round(value(mem["cpu"], "c=64", "shardgate", "hot\n(h2load)"), 1) == 29.8
    assert round(value(mem["latency"], "c=64", "shardgate", "hot\n(h2load)")[1], 1) == 5.0
    ddb = extracted(RESULTS / "2026-11-30-1539-dynamodb.json")
    # README: c=16, 1,363 decisions/s, 0.89 of the loop, 1.047 store calls per decision
    assert round(value(ddb["throughput"], "admitted", "shardgate, admitted", "c=16")) == 1363
    assert round(value(ddb["store"], "per admitted decision", "store calls", "c=16"), 3) == 1.047
    assert ddb["throughput"]["panels"][0]["notes"][1] == "0.89×"


def test_rounds_are_summarised_by_their_median():
    got = extracted(RESULTS / "2026-11-30-1535-memory.json")
    assert "median of 3 rounds" in got["throughput"]["title"]
    # bench/README.md: medians of the rounds' ratios 0.89 / 0.85 / 0.90, CPU 1.17 / 1.23 / 1.20
    assert got["throughput"]["panels"][0]["notes"] == ["0.89×", "0.85×", "0.90×"]
    assert got["cpu"]["panels"][0]["notes"] == ["1.17×", "1.23×", "1.20×"]


def test_missing_data_skips_charts_without_failing():
    doc = json.loads((RESULTS / "2026-11-30-1539-dynamodb.json").read_text())
    for case in doc["cases"]:
        for run in case.values():
            if isinstance(run, dict):
                run.pop("latency", None)
                run.pop("latency_us", None)
                run.pop("server", None)
    got = {c["name"] for c in charts.extract(doc, "trimmed.json")}
    assert got == {"throughput", "cpu"}


@pytest.mark.parametrize("doc, what", [
    ([], 'no "cases" list'),
    ({"machine": {}}, 'no "cases" list'),
    ({"cases": []}, "no cases"),
    ({"cases": [{"foo": 1}]}, "neither"),
])
def test_bad_input_names_the_file_and_what_is_missing(doc, what):
    with pytest.raises(charts.BadResult, match=re.escape(what)) as e:
        charts.extract(doc, "bench/results/x.json")
    assert str(e.value).startswith("bench/results/x.json: ")


def test_unreadable_files_fail_with_their_name(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(charts.BadResult, match=f"^{re.escape(str(bad))}: not JSON"):
        charts.load(str(bad))
    with pytest.raises(charts.BadResult, match="cannot read"):
        charts.load(str(tmp_path / "missing.json"))


def test_the_readme_shows_committed_charts_of_committed_results():
    shown = re.findall(r"\]\((bench/results/[\w.-]+\.svg)\)", README)
    assert shown, "README.md shows no chart"
    for svg in shown:
        assert (REPO / svg).is_file(), svg
    for svg in RESULTS.glob("*.svg"):
        stem = re.sub(r"-(throughput|cpu|latency|store)\.svg$", "", svg.name)
        assert (RESULTS / f"{stem}.json").is_file(), f"{svg.name} has no result beside it"


def test_drawing_is_byte_stable(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (bench/requirements.txt; bench/run installs it)")
    assert CITED, "README.md cites no bench result"
    for path in CITED:
        for spec, out in charts.outputs(str(tmp_path / path.name), charts.extract(charts.load(str(path)), str(path))):
            charts.draw(spec, out)
            first = pathlib.Path(out).read_bytes()
            assert first.startswith(b"<?xml") and b"<svg" in first[:600]
            if spec["name"] == "throughput":
                charts.draw(spec, out)
                assert pathlib.Path(out).read_bytes() == first


_fspec = importlib.util.spec_from_file_location("failover_chart", REPO / "bench" / "failover_chart.py")
failover_chart = importlib.util.module_from_spec(_fspec)
_fspec.loader.exec_module(failover_chart)

# A made-up failover timeline, in the form tests/python/test_redis_cluster_failover.py
# writes it: each call's end (s from the event), its bucket and its outcome.
TIMELINE = {
    "scenario": "master killed", "started": -0.25,
    "marks": {"settled": 0.12, "first script": None},
    "calls": [[-0.24, "hot", "ok"], [-0.2, "roomy", "ok"], [-0.04, "hot", "over"],
              [0.01, "hot", "unavailable"], [0.02, "roomy", "unavailable"],
              [0.16, "hot", "ok"], [0.19, "hot", "over"]],
}


def test_failover_chart_counts_each_call_once_in_its_100ms_bin():
    xs, counts = failover_chart.binned(TIMELINE)
    assert [round(x, 2) for x in xs] == [-0.25, -0.15, -0.05, 0.05, 0.15]
    assert counts["hot bucket admitted"] == [1, 0, 0, 0, 1]
    assert counts["hot bucket refused (over limit)"] == [0, 0, 1, 0, 1]
    assert counts["roomy bucket admitted"] == [1, 0, 0, 0, 0]
    # UNAVAILABLE from either bucket is one series: both calls fell in the third bin.
    assert counts["failure_mode (UNAVAILABLE)"] == [0, 0, 2, 0, 0]


def test_the_failover_chart_the_docs_show_is_committed_and_drawn_stably(tmp_path):
    assert (REPO / "docs" / "failover-master-killed.svg").is_file()
    assert "(failover-master-killed.svg)" in (REPO / "docs" / "operations.md").read_text()
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (bench/requirements.txt)")
    out = tmp_path / "x.svg"
    failover_chart.draw(TIMELINE, out)
    first = out.read_bytes()
    assert first.startswith(b"<?xml") and b"settled (+0.12 s)" in first
    failover_chart.draw(TIMELINE, out)
    assert out.read_bytes() == first
