#!/usr/bin/env python3
"""SVG charts of load-benchmark results (the JSON bench/bench.py writes; see bench/README.md).

    python bench/charts.py bench/results/X.json [more.json ...]

writes, beside each X.json, the charts whose data the file holds:

    X-throughput.svg  req/s of shardgate and of its ceiling (memory: the no-op RLS, per
                      scenario, a panel per concurrency; behind Envoy: the same, as wrk saw
                      it through Envoy; DynamoDB: the bare UpdateItem loop, per
                      concurrency, and the refusals/s)
    X-cpu.svg         CPU µs per decision of the server (on DynamoDB also DynamoDB Local's;
                      behind Envoy also Envoy's, a panel of its own)
    X-latency.svg     p50 / p99 / p99.9 per case, log scale
    X-store.svg       DynamoDB only: store calls, write calls and write units per decision

bench.py runs this after every result it writes; it needs matplotlib (bench/requirements.txt,
installed by bench/run). The output is byte-stable for one matplotlib version: fixed SVG id
salt, no date. `extract()` is the part without matplotlib: JSON in, chart data out.
"""
import json
import math
import os
import statistics
import sys

# The store calls that write, as bench.py counts them ("debit/applied" -> "debit").
WRITES = {"debit", "commit", "credit", "bump_shard_count", "raise_shard_count"}
PERCENTILES = ("p50", "p99", "p99.9")
MAX_CASES = 10_000  # bound on the cases read from one file


class BadResult(ValueError):
    """The file is not a bench result this script can read."""


def num(d, *keys):
    """d[k1][k2]... as a finite float, else None (missing, not a number, NaN)."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
        return None
    return float(d)


def per(a, b):
    return a / b if a is not None and b else None


def median(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def latency_ms(run, key="latency"):
    """(p50, p99, p99.9) in ms from a run's latency (µs), or None."""
    lat = run.get(key) if isinstance(run, dict) else None
    if not isinstance(lat, dict):
        lat = run.get("latency_us") if isinstance(run, dict) else None
    if not isinstance(lat, dict):
        return None
    v = [num(lat, p) for p in PERCENTILES]
    return None if None in v else tuple(x / 1000 for x in v)


def chart(name, title, ylabel, panels, kind="bars", log=False):
    """One chart, or None when no panel has a value to draw."""
    panels = [p for p in panels if any(v is not None for s in p["series"] for v in s["values"])]
    if not panels:
        return None
    for p in panels:  # a series with nothing in this panel only clutters the legend
        p["series"] = [s for s in p["series"] if any(v is not None for v in s["values"])]
    return {"name": name, "title": title, "ylabel": ylabel, "kind": kind, "log": log, "panels": panels}


def panel(title, groups, series, notes=None, hline=None):
    return {"title": title, "groups": groups, "series": series, "notes": notes, "hline": hline}


def series(label, values, ceiling=False, runs=None, annotate=False):
    return {"label": label, "values": values, "ceiling": ceiling, "runs": runs, "annotate": annotate}


def million(v):
    return v * 1e6 if v is not None else None


def ratio_note(a, b):
    return f"{a / b:.2f}×" if a is not None and b else None


# ---- memory runs: cases {scenario, tool, concurrency, [round], shardgate, ceiling} --------
# ---- behind Envoy: the same, with kind "envoy", tool "wrk" and Envoy's CPU per request ----


def memory_charts(cases, what="Memory store", default_tool="h2load", envoy=False):
    def tool(c):
        return c.get("tool") if isinstance(c.get("tool"), str) else None

    tools = {}
    for c in cases:
        tools.setdefault(c["scenario"], set()).add(tool(c))
    labels, cells = [], {}
    for c in cases:
        label = c["scenario"]
        if len(tools[c["scenario"]]) > 1 or tool(c) not in (None, default_tool):
            label += f"\n({tool(c)})"
        if label not in labels:
            labels.append(label)
        cells.setdefault((label, c["concurrency"]), []).append(c)
    concurrencies = sorted({c["concurrency"] for c in cases})
    rounds = max(len(v) for v in cells.values())
    how = f", median of {rounds} rounds" if rounds > 1 else ""

    def metric(label, conc, who, fn):
        return median(fn(c.get(who)) for c in cells.get((label, conc), []) if isinstance(c.get(who), dict))

    def reqs(r):
        return num(r, "req_per_s")

    def ratios(label, conc, fn):  # the median of each round's ratio, as bench.py reports it
        v = [per(fn(c.get("shardgate")), fn(c.get("ceiling"))) for c in cells.get((label, conc), [])
             if isinstance(c.get("shardgate"), dict) and isinstance(c.get("ceiling"), dict)]
        m = median(v)
        return f"{m:.2f}×" if m is not None else None

    def cpu(r):
        v = num(r, "cpu_us_per_decision")
        if v is None:
            v = million(per(num(r, "server_cpu_s"), num(r, "answers")))
        return v

    def envoy_cpu(r):
        return num(r, "envoy_cpu_us_per_request")

    def lat_median(label, conc, who):
        v = [latency_ms(c.get(who)) for c in cells.get((label, conc), []) if isinstance(c.get(who), dict)]
        v = [x for x in v if x is not None]
        return tuple(statistics.median(x[i] for x in v) for i in range(3)) if v else None

    thr, cpus, lats = [], [], []
    for conc in concurrencies:
        sg = [metric(l, conc, "shardgate", reqs) for l in labels]
        ce = [metric(l, conc, "ceiling", reqs) for l in labels]
        thr.append(panel(f"c={conc}", labels, [series("shardgate", sg), series("no-op ceiling", ce, ceiling=True)],
                         notes=[ratios(l, conc, reqs) for l in labels]))
        sg = [metric(l, conc, "shardgate", cpu) for l in labels]
        ce = [metric(l, conc, "ceiling", cpu) for l in labels]
        cpus.append(panel(f"c={conc}" + (": the RLS server" if envoy else ""), labels,
                          [series("shardgate", sg), series("no-op ceiling", ce, ceiling=True)],
                          notes=[ratios(l, conc, cpu) for l in labels]))
        if envoy:
            sg = [metric(l, conc, "shardgate", envoy_cpu) for l in labels]
            ce = [metric(l, conc, "ceiling", envoy_cpu) for l in labels]
            cpus.append(panel(f"c={conc}: Envoy (1 worker)", labels,
                              [series("Envoy in front of shardgate", sg),
                               series("Envoy in front of the ceiling", ce, ceiling=True)]))
        lats.append(panel(f"c={conc}", labels, [series("shardgate", [lat_median(l, conc, "shardgate") for l in labels]),
                                                 series("no-op ceiling", [lat_median(l, conc, "ceiling") for l in labels], ceiling=True)]))
    return [
        chart("throughput", f"{what}: req/s, shardgate vs the no-op ceiling (ratio above){how}",
              "requests/s", thr),
        chart("cpu", f"{what}: {'CPU per request' if envoy else 'server CPU per decision'} "
              f"(ratio to the ceiling above){how}",
              "CPU, µs per request" if envoy else "server CPU, µs per request", cpus),
        chart("latency", f"{what}: latency p50 / p99 / p99.9{how}", "latency, ms (log scale)",
              lats, kind="ranges", log=True),
    ]


# ---- DynamoDB runs: cases {kind: ceiling|admitted|refused, concurrency, loop|shardgate} ----


def decided(case):
    s = case["shardgate"].get("server")
    key = "descriptors_within" if case["kind"] == "admitted" else "descriptors_over"
    return num(s, key) or num(case["shardgate"], "answers")


def store_figures(case):
    """(store calls, write calls, write units) per decision of a shardgate case."""
    s = case["shardgate"].get("server")
    n = decided(case)
    calls = s.get("store_calls") if isinstance(s, dict) else None
    if not isinstance(calls, dict) or not n:
        return None, None, None
    values = {k: num(calls, k) or 0.0 for k in calls}
    total = sum(values.values())
    writes = sum(v for k, v in values.items() if str(k).split("/")[0] in WRITES)
    units = None
    cap = s.get("consumed_capacity")
    if s.get("consumed_capacity_metric") is True and isinstance(cap, dict):
        units = sum(num(cap, op) or 0.0 for op in cap if op != "BatchGetItem") / n
    return total / n, writes / n, units


def dynamodb_charts(cases):
    loops, shard = {}, {}
    for c in cases:
        if c["kind"] == "ceiling" and isinstance(c.get("loop"), dict):
            loops.setdefault(c["concurrency"], []).append(c["loop"])
        elif c["kind"] in ("admitted", "refused") and isinstance(c.get("shardgate"), dict):
            shard[(c["kind"], c["concurrency"])] = c
    concurrencies = sorted({k[1] for k in shard} | set(loops))
    groups = [f"c={c}" for c in concurrencies]

    def sg(kind, conc, fn):
        case = shard.get((kind, conc))
        return fn(case) if case else None

    def loop_mean(conc, fn):
        v = [fn(lp) for lp in loops.get(conc, [])]
        v = [x for x in v if x is not None]
        return sum(v) / len(v) if v else None

    def loop_pooled(conc, key):  # CPU over all runs / calls over all runs
        lps = [lp for lp in loops.get(conc, []) if num(lp, key) is not None and num(lp, "ok")]
        return per(sum(num(lp, key) for lp in lps), sum(num(lp, "ok") for lp in lps)) if lps else None

    def cpu(key):
        return lambda case: million(per(num(case["shardgate"], key), decided(case)))

    admitted = [sg("admitted", c, lambda k: num(k["shardgate"], "req_per_s")) for c in concurrencies]
    loop = [loop_mean(c, lambda lp: num(lp, "ops_per_s")) for c in concurrencies]
    runs = [[num(lp, "ops_per_s") for lp in loops.get(c, []) if num(lp, "ops_per_s") is not None] for c in concurrencies]
    refused = [sg("refused", c, lambda k: num(k["shardgate"], "req_per_s")) for c in concurrencies]
    thr = [
        panel("admitted", groups, [series("shardgate, admitted", admitted),
                                   series("bare UpdateItem loop (mean; dots: its runs)", loop, ceiling=True, runs=runs)],
              notes=[ratio_note(a, b) for a, b in zip(admitted, loop)]),
        panel("refused (rejection cache)", groups, [series("shardgate, refused", refused, annotate=True)]),
    ]

    cpus = [
        panel("shardgate / the bare loop process", groups, [
            series("shardgate, admitted", [sg("admitted", c, cpu("server_cpu_s")) for c in concurrencies]),
            series("bare loop, its own CPU per call", [million(loop_pooled(c, "client_cpu_s")) for c in concurrencies], ceiling=True),
            series("shardgate, refused", [sg("refused", c, cpu("server_cpu_s")) for c in concurrencies]),
        ]),
        panel("DynamoDB Local", groups, [
            series("during shardgate, admitted", [sg("admitted", c, cpu("store_cpu_s")) for c in concurrencies]),
            series("during the bare loop", [million(loop_pooled(c, "store_cpu_s")) for c in concurrencies], ceiling=True),
        ]),
    ]

    whens = []
    for c in concurrencies:
        for i, lp in enumerate(loops.get(c, [])):
            w = lp.get("when") if isinstance(lp.get("when"), str) else f"run {i + 1}"
            if w not in whens:
                whens.append(w)

    def loop_latency(conc, when):
        for i, lp in enumerate(loops.get(conc, [])):
            if (lp.get("when") if isinstance(lp.get("when"), str) else f"run {i + 1}") == when:
                return latency_ms(lp, "latency_us")
        return None

    lat = [panel("", groups, [
        series("shardgate, admitted", [sg("admitted", c, lambda k: latency_ms(k["shardgate"])) for c in concurrencies]),
        *[series(f"bare loop, {w}", [loop_latency(c, w) for c in concurrencies], ceiling=True) for w in whens],
        series("shardgate, refused", [sg("refused", c, lambda k: latency_ms(k["shardgate"])) for c in concurrencies]),
    ])]

    fig = {kind: [sg(kind, c, store_figures) or (None, None, None) for c in concurrencies] for kind in ("admitted", "refused")}
    loop_units = [loop_mean(c, lambda lp: num(lp, "write_units_per_op")) for c in concurrencies]
    store = [
        panel("per admitted decision", groups, [
            series("store calls", [f[0] for f in fig["admitted"]], annotate=True),
            series("write calls", [f[1] for f in fig["admitted"]], annotate=True),
            series("write units (reported)", [f[2] for f in fig["admitted"]], annotate=True),
            series("bare loop: write units per call", loop_units, ceiling=True, annotate=True),
        ], hline=1.0),
        panel("per million refusals", groups, [
            series("store calls", [million(f[0]) for f in fig["refused"]], annotate=True),
            series("write units (reported)", [million(f[2]) for f in fig["refused"]], annotate=True),
        ]),
    ]
    if all(v is None for f in fig["admitted"] + fig["refused"] for v in f):
        store = []  # the loop's write units alone say nothing about shardgate
    return [
        chart("throughput", "DynamoDB Local: decisions/s, shardgate vs the bare UpdateItem loop (ratio above)",
              "decisions/s", thr),
        chart("cpu", "DynamoDB Local: CPU per decision", "CPU, µs per decision (loop: per call)", cpus),
        chart("latency", "DynamoDB Local: latency p50 / p99 / p99.9", "latency, ms (log scale)", lat,
              kind="ranges", log=True),
        chart("store", "DynamoDB Local: store calls and writes per decision (line: 1 per admitted decision)",
              "per decision", store),
    ]


def extract(doc, source="<input>"):
    """The charts of one result document (the parsed JSON): a list of chart dicts, only
    those with data. Raises BadResult naming `source` and what is missing."""
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise BadResult(f"{source}: not a bench result: no \"cases\" list at the top level")
    cases = doc["cases"][:MAX_CASES]
    if not cases:
        raise BadResult(f"{source}: no cases in \"cases\"")
    memory = [c for c in cases if isinstance(c, dict) and isinstance(c.get("scenario"), str)
              and isinstance(c.get("concurrency"), int)]
    dynamo = [c for c in cases if isinstance(c, dict) and c.get("kind") in ("ceiling", "admitted", "refused")
              and isinstance(c.get("concurrency"), int)]
    envoy = [c for c in memory if c.get("kind") == "envoy"]
    if envoy and len(envoy) == len(memory) and not dynamo:
        charts = memory_charts(envoy, "Behind Envoy (1 worker), wrk", default_tool="wrk", envoy=True)
    elif memory and not dynamo and not envoy:
        charts = memory_charts(memory)
    elif dynamo and not memory:
        charts = dynamodb_charts(dynamo)
    else:
        raise BadResult(f"{source}: the cases are neither all memory cases (\"scenario\", \"concurrency\"), "
                        f"all Envoy cases (\"kind\": \"envoy\", \"scenario\", \"concurrency\") "
                        f"nor all DynamoDB cases (\"kind\", \"concurrency\")")
    return [c for c in charts if c]


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise BadResult(f"{path}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise BadResult(f"{path}: not JSON: {e}") from None


# ---- drawing (matplotlib) --------------------------------------------------------------

PALETTE = ["#2a6fb0", "#e07b39", "#4c9a52", "#8e6bb8", "#c44e52"]
CEILING = ["#9a9a9a", "#5f5f5f", "#c4c4c4"]
MARKERS = {"p50": "o", "p99": "s", "p99.9": "^"}


def colours(panels):
    """A colour per series label, the same in every panel; ceilings in greys."""
    out, p, c = {}, 0, 0
    for s in (s for pn in panels for s in pn["series"]):
        if s["label"] in out:
            continue
        if s["ceiling"]:
            out[s["label"]] = CEILING[c % len(CEILING)]
            c += 1
        else:
            out[s["label"]] = PALETTE[p % len(PALETTE)]
            p += 1
    return out


def short(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v / 1000:.1f}k"
    if abs(v) >= 10:
        return f"{v:.0f}"
    if abs(v) >= 0.01:
        return f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 1 else f"{v:.3f}"
    return f"{v:.4f}"


def draw(spec, path):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({
        "svg.hashsalt": "shardgate-bench",  # stable ids
        "svg.fonttype": "none",  # text stays text: small files, readable diffs
        "font.family": "sans-serif",
        "font.size": 9,
    })
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    panels = spec["panels"]
    widths = [max(2.4, 0.9 + 0.32 * len(p["groups"]) * max(1, len(p["series"]))) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(min(max(sum(widths) + 0.8, 8), 16), 4.4),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    handles, palette = {}, colours(panels)
    for ax, p in zip(axes[0], panels):
        n = max(1, len(p["series"]))
        width = 0.8 / n
        xs = range(len(p["groups"]))
        tops = [0.0] * len(p["groups"])
        for j, s in enumerate(p["series"]):
            colour = palette[s["label"]]
            off = (j - (n - 1) / 2) * width
            for i, v in enumerate(s["values"]):
                if v is None:
                    continue
                x = i + off
                if spec["kind"] == "ranges":
                    ax.plot([x, x], [v[0], v[2]], color=colour, linewidth=2, solid_capstyle="butt")
                    for k, q in enumerate(PERCENTILES):
                        ax.plot([x], [v[k]], marker=MARKERS[q], color=colour, markersize=5, linestyle="none")
                    tops[i] = max(tops[i], v[2])
                else:
                    ax.bar(x, v, width * 0.92, color=colour)
                    tops[i] = max(tops[i], v)
                    if s["annotate"]:
                        ax.annotate(short(v), (x, v), xytext=(0, 2), textcoords="offset points",
                                    ha="center", va="bottom", fontsize=7, rotation=90 if n > 2 else 0)
                if s["runs"] and i < len(s["runs"]):
                    ax.plot([x] * len(s["runs"][i]), s["runs"][i], marker=".", color="black",
                            linestyle="none", markersize=5)
                    tops[i] = max([tops[i], *s["runs"][i]])
            handles.setdefault(s["label"], Line2D([], [], color=colour, linewidth=6 if spec["kind"] == "bars" else 2))
        if p["notes"]:
            for i, note in enumerate(p["notes"]):
                if note:
                    ax.annotate(note, (i, tops[i]), xytext=(0, 3), textcoords="offset points",
                                ha="center", va="bottom", fontsize=8)
        if p["hline"] is not None:
            ax.axhline(p["hline"], color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(p["groups"], fontsize=8)
        ax.set_title(p["title"], fontsize=9)
        ax.margins(y=0.18)
        if spec["log"]:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if abs(v) >= 1000 else f"{v:g}"))
        ax.grid(axis="y", linewidth=0.4, alpha=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0][0].set_ylabel(spec["ylabel"])
    legend = list(handles.values())
    names = list(handles)
    if spec["kind"] == "ranges":
        for q in PERCENTILES:
            legend.append(Line2D([], [], marker=MARKERS[q], color="black", linestyle="none"))
            names.append(q)
    fig.suptitle(spec["title"], fontsize=10)
    fig.legend(legend, names, loc="lower center", ncol=min(len(names), 4), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.04 * ((len(names) - 1) // 4), 1, 1))
    fig.savefig(path, format=os.path.splitext(path)[1][1:] or "svg", metadata={"Date": None} if path.endswith(".svg") else None)
    plt.close(fig)


def outputs(json_path, charts):
    stem = json_path[:-5] if json_path.endswith(".json") else json_path
    return [(c, f"{stem}-{c['name']}.svg") for c in charts]


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("charts.py needs matplotlib: pip install -r bench/requirements.txt", file=sys.stderr)
        return 1
    status = 0
    for path in argv:
        try:
            charts = extract(load(path), path)
        except BadResult as e:
            print(f"charts.py: {e}", file=sys.stderr)
            status = 1
            continue
        for spec, out in outputs(path, charts):
            draw(spec, out)
            print(f"wrote {out}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
