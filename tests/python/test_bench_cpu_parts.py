"""bench/cpu_parts.py: a perf sample counts for the part of the first frame, from the leaf,
that belongs to one (a malloc under the reader is decode, a kernel write under h2 is
transport), a sample of no part is `other`, and the shares and µs per request add up."""
import importlib.util
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "cpu_parts.py"
_spec = importlib.util.spec_from_file_location("bench_cpu_parts", SCRIPT)
cpu_parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_parts)


def sample(period, *frames):
    """One sample as `perf script -F period,ip,sym` prints it, leaf first."""
    lines = [f"   {period} "]
    lines += [f"\t        {0x1000 + i:x} {f}" for i, f in enumerate(frames)]
    return "\n".join(lines) + "\n\n"


SAMPLES = (
    sample(3, "__GI___libc_malloc (inlined)",
           "shardgate::service::wire::RequestView::decode (inlined)",
           "shardgate::service::rls::Rls<S>::should_rate_limit::{{closure}}",
           "tonic::server::grpc::Grpc<T>::unary::{{closure}}")
    + sample(2, "ffffffff81000130 entry_SYSCALL_64_after_hwframe", "__GI___writev",
             "h2::codec::framed_write::FramedWrite<T,B>::flush", "tokio::runtime::task::raw::poll")
    + sample(1, "<shardgate::store::memory::MemoryStore as shardgate::store::BucketStore>::debit",
             "shardgate::engine::acquire::<impl shardgate::engine::Engine<S>>::acquire::{{closure}} (inlined)")
    + sample(1, "[unknown]", "__libc_start_main")
    + sample(1, "tokio::runtime::scheduler::multi_thread::worker::Context::run")
)


def test_each_sample_counts_for_the_part_nearest_its_leaf():
    parts = [cpu_parts.part_of(frames) for _, frames in cpu_parts.samples(SAMPLES.splitlines(True))]
    assert parts == ["decode", "transport (h2, hyper)", "store", "other", "runtime (tokio)"]


def test_the_table_gives_shares_and_microseconds_per_request():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--requests", "1000", "--cpu-s", "0.008", "--json"],
        input=SAMPLES, capture_output=True, text=True, check=True,
    ).stdout
    report = json.loads(out)
    rows = {r["part"]: r for r in report["rows"]}
    assert report["us_per_request"] == 8.0
    assert rows["decode"]["share"] == 3 / 8
    assert rows["decode"]["us_per_request"] == 3.0
    assert rows["transport (h2, hyper)"]["us_per_request"] == 2.0
    assert sum(r["share"] for r in rows.values()) == 1.0
    table = subprocess.run([sys.executable, str(SCRIPT)], input=SAMPLES, capture_output=True,
                           text=True, check=True).stdout
    assert "| decode | 37.5 % | – |" in table
