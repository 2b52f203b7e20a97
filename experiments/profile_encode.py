"""Where one query's ``Searcher.encode`` spends its time, stock or patched (GPU).

For each system: the median wall time of an encode, the GPU kernel time per encode (from
torch.profiler, so the rest is host work and waiting), and the Python functions with the most
own time (cProfile). Runs on the bundle that ``experiments.bench_plaid prepare`` writes, with
its encoder or with a random-weight encoder of a real size::

    python -m experiments.profile_encode --bundle runs/plaid_bench --encoder-shapes bundle bert-base
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pathlib
import pstats
import shutil
import statistics
import tempfile
import time

import torch

from . import bench_plaid


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _wall_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _gpu_ms_per_call(fn, calls: int) -> float | None:
    """Kernel and copy time on the GPU per call (None without a GPU or a working profiler)."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    except Exception as error:  # noqa: BLE001 (the profiler is optional here, the timings are not)
        print(f"profile_encode: torch.profiler failed ({type(error).__name__}: {error})")
        return None
    return sum(e.device_time_total for e in device_events) / 1e3 / calls


def _top_functions(fn, calls: int, lines: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    _sync()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def profile_encoder(searcher, text: str, label: str, calls: int, lines: int) -> list[dict]:
    rows = []
    for provider in (bench_plaid.STOCK, bench_plaid.PATCHED):
        bench_plaid._patch_as(provider)

        def encode():
            searcher.encode(text)

        for _ in range(10):  # warm-up: graph capture, kernel selection
            encode()
        wall = _wall_ms(encode, calls)
        gpu = _gpu_ms_per_call(encode, calls)
        gpu_text = "no GPU profile" if gpu is None else f"{gpu:.3f} ms of GPU kernels and copies"
        print(f"=== {label} {provider}: encode {wall:.3f} ms wall, {gpu_text} per call")
        print(_top_functions(encode, calls, lines))
        rows.append({"encoder": label, "provider": provider, "wall_ms": wall, "gpu_kernel_ms": gpu})
    return rows


def _union_us(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def _replay_cost(graph, calls: int = 50) -> tuple[float, float]:
    """(host ms inside ``graph.replay()``, GPU ms from its first to its last node), medians of
    unprofiled replays, each started on an idle GPU."""
    host, device = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        start = time.perf_counter()
        graph.replay()
        host.append((time.perf_counter() - start) * 1e3)
        after.record()
        torch.cuda.synchronize()
        device.append(before.elapsed_time(after))
    return statistics.median(host), statistics.median(device)


def _graph_replay_costs(searcher) -> dict:
    """Replay cost of the encoder's and the search's CUDA graphs that the calls above made."""
    from tilemaxsim_plaid.plaid import encoder_graphs, graphs

    costs = {}
    found = {"encoder": searcher.checkpoint.__dict__.get(encoder_graphs._CACHE_ATTRIBUTE, {}),
             "search": searcher.ranker.__dict__.get(graphs._CACHE_ATTRIBUTE, {})}
    for name, cache in found.items():
        captured = [c for c in cache.values() if c is not None]
        if captured:
            with torch.inference_mode():
                host, device = _replay_cost(captured[-1].graph)
            costs[f"{name}_graph_replay_host"], costs[f"{name}_graph_gpu"] = host, device
    return costs


_MARKS = (  # (owner: "module" or "module:Class", attribute, label): a mark before and after each call
    ("tilemaxsim_plaid.plaid.query_tokens:HostQueryTokenizer", "tensorize", "tokens"),
    ("tilemaxsim_plaid.plaid.query_tokens:HostQueryTokenizer", "rows", "token rows"),
    ("tilemaxsim_plaid.plaid.query_tokens:PinnedUploads", "upload", "token upload"),
    ("tilemaxsim_plaid.plaid.encoder_graphs", "_graph_inputs", "graph inputs"),
    ("tilemaxsim_plaid.plaid.encoder_graphs", "_key", "graph key"),
    ("tilemaxsim_plaid.plaid.encoder_graphs:_CapturedEncoder", "__call__", "encoder_graph"),
    ("tilemaxsim_plaid.plaid.encoder_graphs:LinearWeightCopies", "refresh", "weight refresh"),
    ("torch.cuda.graphs:CUDAGraph", "replay", "replay"),
    ("tilemaxsim_plaid.plaid.scoring", "rank_on_device", "rank_on_device"),
    ("tilemaxsim_plaid.plaid.scoring", "device_index", "device_index"),
    ("tilemaxsim_plaid.plaid.graphs:_CapturedSearch", "__call__", "search_graph"),
    ("tilemaxsim_plaid.plaid.scoring:RankedCandidates", "to_lists", "to_lists"),
)


def search_marks(searcher, text: str, calls: int, k: int = 10) -> dict[str, tuple[float, float]]:
    """Unprofiled timeline of a patched ``Searcher.search`` call: for each mark (before and after
    each step in :data:`_MARKS`; a step run twice in a call gets ``#2``), the host time it was reached and the time the GPU reached the CUDA event
    recorded there, both in ms from the call's start (medians over ``calls``). The call starts
    on an idle GPU with an event, so the GPU clock's origin is the host's. Marks cost a few us."""
    import importlib

    bench_plaid._patch_as(bench_plaid.PATCHED)
    log: list[tuple[str, float, torch.cuda.Event]] = []

    def mark(name):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        seen = sum(1 for logged, _, _ in log if logged.split("#")[0] == name)
        log.append((f"{name}#{seen + 1}" if seen else name, time.perf_counter(), event))

    originals = []
    for path, method, name in _MARKS:
        module, _, cls = path.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        original = getattr(owner, method)
        originals.append((owner, method, original))

        def marked(*args, _original=original, _name=name, **kwargs):
            mark(f"{_name} start")
            result = _original(*args, **kwargs)
            mark(f"{_name} end")
            return result

        setattr(owner, method, marked)
    samples: dict[str, list[tuple[float, float]]] = {}
    try:
        for call in range(10 + calls):
            torch.cuda.synchronize()
            log.clear()
            mark("call start")
            searcher.search(text, k=k)
            mark("call end")
            torch.cuda.synchronize()
            if call < 10:
                continue  # warm-up: captures, caches
            _, host0, event0 = log[0]
            for name, host, event in log:
                samples.setdefault(name, []).append(((host - host0) * 1e3, event0.elapsed_time(event)))
    finally:
        for owner, method, original in originals:
            setattr(owner, method, original)
    medians = {name: (statistics.median(h for h, _ in values), statistics.median(g for _, g in values))
               for name, values in samples.items()}
    return dict(sorted(medians.items(), key=lambda item: item[1][0]))


def search_timeline(searcher, text: str, label: str, calls: int, k: int = 10,
                    top_kernels: int = 40) -> dict | None:
    """Where a patched ``Searcher.search`` call's wall time goes, from one torch.profiler trace
    of ``calls`` warm calls (medians, ms): host time before the GPU's first operation, the GPU's
    busy time and idle gaps between its first and last operation, the host tail after the last
    one, and the host time spent inside ``cudaGraphLaunch``. The profiler adds some host time,
    so the wall here is a little above the unprofiled one."""
    if not torch.cuda.is_available():
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    bench_plaid._patch_as(bench_plaid.PATCHED)
    for _ in range(10):
        searcher.search(text, k=k)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            with record_function("search_call"):
                searcher.search(text, k=k)
            torch.cuda.synchronize()
    events = list(prof.events())
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == "search_call")
    # GPU operations, without the annotation's own mirror on the GPU timeline; a call owns those
    # that start before the next call does (calls are separated by a sync).
    gpu = [(e.time_range.start, e.time_range.end) for e in events
           if e.device_type == DeviceType.CUDA and e.name != "search_call"]
    launches = [(e.time_range.start, e.time_range.end) for e in events
                if e.device_type == DeviceType.CPU and e.name == "cudaGraphLaunch"]
    parts = {key: [] for key in ("wall", "host_before_gpu", "gpu_busy", "gpu_idle", "host_after_gpu",
                                 "graph_launch_host", "graph_launches")}
    bounds = [start for start, _ in spans[1:]] + [float("inf")]
    for (start, end), next_start in zip(spans, bounds):
        mine = [(a, b) for a, b in gpu if start <= a < next_start]
        if not mine:
            continue
        first, last = min(a for a, _ in mine), max(b for _, b in mine)
        busy = _union_us(mine)
        in_call = [(a, b) for a, b in launches if start <= a <= end]
        for key, value in (("wall", end - start), ("host_before_gpu", first - start), ("gpu_busy", busy),
                           ("gpu_idle", (last - first) - busy), ("host_after_gpu", max(0.0, end - last)),
                           ("graph_launch_host", sum(b - a for a, b in in_call))):
            parts[key].append(value / 1e3)
        parts["graph_launches"].append(len(in_call))
    if not parts["wall"]:
        return None
    # The GPU operations of a call by name: how many per call and their time per call.
    per_name: dict[str, list[float]] = {}
    for e in events:
        if e.device_type == DeviceType.CUDA and e.name != "search_call" and spans[0][0] <= e.time_range.start:
            per_name.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    print(f"--- {label}: GPU operations per Searcher.search call (profiled), by total time")
    print(f"{'us/call':>9} {'count':>6}  name")
    for name, durations in sorted(per_name.items(), key=lambda item: -sum(item[1]))[:top_kernels]:
        print(f"{sum(durations) / len(spans):>9.1f} {len(durations) / len(spans):>6.1f}  {name[:110]}")
    row = {"encoder": label, "k": k, **{key: statistics.median(values) for key, values in parts.items()},
           **_graph_replay_costs(searcher)}
    print(f"=== {label} tilemaxsim: Searcher.search timeline (k={k}, median of {len(parts['wall'])}, "
          f"profiled): " + ", ".join(f"{key} {value:.3f}" for key, value in row.items()
                                     if isinstance(value, float)))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="profile_encode", description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", default="runs/plaid_bench")
    parser.add_argument("--encoder-shapes", nargs="+", default=["bundle", "bert-base"],
                        choices=["bundle", *sorted(bench_plaid.ENCODER_SHAPES)])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--lines", type=int, default=25, help="cProfile lines per system")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_encode: no GPU; on the CPU the plugin runs colbert-ai's encoder unchanged")

    bench_plaid._prepare_colbert_imports()
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    from tilemaxsim_plaid.plaid import registry

    registry.enable()  # its compat group is what lets colbert-ai load checkpoints on transformers 5

    bundle = pathlib.Path(args.bundle)
    encoder = str(bundle / bench_plaid.BUNDLE_ENCODER)
    text = torch.load(bundle / bench_plaid.BUNDLE_QUERIES)["texts"][0]
    searcher = bench_plaid._searcher(bundle / "indexes", bench_plaid.BUNDLE_INDEX_NAME, encoder)
    work = pathlib.Path(tempfile.mkdtemp(prefix="profile_encode_"))
    rows, timelines = [], []
    try:
        for shape in args.encoder_shapes:
            if shape != "bundle":
                path = bench_plaid._random_encoder(work / shape, work, shape, searcher.config.dim, encoder)
                checkpoint = Checkpoint(path, colbert_config=ColBERTConfig.load_from_checkpoint(path), verbose=0)
                searcher.checkpoint = checkpoint.cuda() if torch.cuda.is_available() else checkpoint
            rows += profile_encoder(searcher, text, shape, args.calls, args.lines)
            if torch.cuda.is_available():
                marks = search_marks(searcher, text, min(args.calls, 50))
                print(f"=== {shape} tilemaxsim: Searcher.search marks, unprofiled (ms from the call's start)")
                print(f"{'mark':<22} {'host':>8} {'GPU':>8}")
                for name, (host, device) in marks.items():
                    print(f"{name:<22} {host:>8.3f} {device:>8.3f}")
            timeline = search_timeline(searcher, text, shape, min(args.calls, 50))
            if timeline is not None:
                timelines.append(timeline)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'encoder':<12} {'system':<12} {'wall ms':>8} {'GPU ms':>8}")
    for row in rows:
        gpu = "-" if row["gpu_kernel_ms"] is None else f"{row['gpu_kernel_ms']:.3f}"
        print(f"{row['encoder']:<12} {row['provider']:<12} {row['wall_ms']:>8.3f} {gpu:>8}")
    if timelines:
        keys = ("wall", "host_before_gpu", "gpu_busy", "gpu_idle", "host_after_gpu", "graph_launch_host")
        print("patched Searcher.search, profiled (ms):")
        print(f"{'encoder':<12} " + " ".join(f"{key:>17}" for key in keys))
        for row in timelines:
            print(f"{row['encoder']:<12} " + " ".join(f"{row[key]:>17.3f}" for key in keys))
        keys = ("encoder_graph_replay_host", "encoder_graph_gpu", "search_graph_replay_host", "search_graph_gpu")
        print("one graph replay on an idle GPU, unprofiled (ms):")
        print(f"{'encoder':<12} " + " ".join(f"{key:>25}" for key in keys))
        for row in timelines:
            print(f"{row['encoder']:<12} " + " ".join(f"{row.get(key, float('nan')):>25.3f}" for key in keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
