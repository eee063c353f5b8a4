#!/usr/bin/env python3
"""A Redis Cluster failover, call by call: SVG charts of what three shardgate servers
answered per 100 ms through each scenario of tests/python/test_redis_cluster_failover.py.

    SHARDGATE_FAILOVER_TIMELINE=/tmp/fo .venv/bin/python -m pytest \\
        tests/python/test_redis_cluster_failover.py
    .venv/bin/python bench/failover_chart.py /tmp/fo docs/failover

reads every <scenario>.json the test wrote into the folder (each call's end and outcome
and the scenario's moments, in seconds from the event) and writes <prefix>-<scenario>.svg:
per 100 ms, the hot bucket's admitted and refused calls, the roomy bucket's admitted
calls, and the failure_mode answers (UNAVAILABLE, either bucket), with the event and the
moments the test saw (promotion, first script on the new owner, the Cluster down and up)
as vertical lines. Needs matplotlib (bench/requirements.txt). Output is byte-stable for
one matplotlib version (fixed SVG id salt, no date).
"""
import json
import pathlib
import sys

BIN_S = 0.1
SERIES = [  # (label, bucket or None for both, outcome, colour)
    ("hot bucket admitted", "hot", "ok", "#2b7bba"),
    ("hot bucket refused (over limit)", "hot", "over", "#9ecae1"),
    ("roomy bucket admitted", "roomy", "ok", "#31a354"),
    ("failure_mode (UNAVAILABLE)", None, "unavailable", "#d62728"),
]
MAX_CALLS = 5_000_000  # bound on the calls read from one file


def binned(data):
    """(bin starts, {label: counts per bin}) from a scenario's calls."""
    calls = data["calls"][:MAX_CALLS]
    start = data.get("started") or min((c[0] for c in calls), default=0.0)
    end = max((c[0] for c in calls), default=start)
    n = max(1, int((end - start) / BIN_S) + 1)
    xs = [start + i * BIN_S for i in range(n)]
    counts = {label: [0] * n for label, *_ in SERIES}
    for t, bucket, outcome in calls:
        i = min(n - 1, max(0, int((t - start) / BIN_S)))
        for label, want_bucket, want_outcome, _ in SERIES:
            if outcome == want_outcome and want_bucket in (None, bucket):
                counts[label][i] += 1
    return xs, counts


def draw(data, out):
    import matplotlib
    matplotlib.use("svg")
    matplotlib.rcParams["svg.hashsalt"] = "shardgate"
    import matplotlib.pyplot as plt

    xs, counts = binned(data)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for label, _, _, colour in SERIES:
        ax.plot(xs, counts[label], label=label, color=colour, linewidth=1.2,
                drawstyle="steps-post")
    ax.axvline(0, color="black", linewidth=1)
    ax.text(0, 1.01, " event", transform=ax.get_xaxis_transform(), fontsize=8)
    for i, (name, at) in enumerate(sorted((k, v) for k, v in data["marks"].items()
                                          if v is not None)):
        ax.axvline(at, color="grey", linestyle="--", linewidth=0.8)
        ax.text(at, 0.95 - 0.08 * i, f" {name} ({at:+.2f} s)",
                transform=ax.get_xaxis_transform(), fontsize=7, color="dimgrey")
    ax.set_xlabel("seconds from the event")
    ax.set_ylabel(f"calls per {int(BIN_S * 1000)} ms")
    ax.set_title(f"Redis Cluster, {data['scenario']}: three shardgate servers, "
                 "one hot limited bucket and one roomy", fontsize=9)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out, metadata={"Date": None})
    plt.close(fig)


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    folder, prefix = pathlib.Path(argv[1]), argv[2]
    files = sorted(folder.glob("*.json"))
    if not files:
        sys.exit(f"no <scenario>.json in {folder}: run the test with SHARDGATE_FAILOVER_TIMELINE")
    for f in files:
        out = pathlib.Path(f"{prefix}-{f.stem}.svg")
        draw(json.loads(f.read_text()), out)
        print(out)


if __name__ == "__main__":
    main(sys.argv)
