"""One timing harness for every benchmark: ceilings, timings, provenance, tables and result files.

A row is a plain dict in long format (one row per shape and provider), so plots and reports read
only the written files:
    suite, shape, provider, ms, ms_p20, ms_p80, docs_per_s, bytes, gbps, pct_read_bw, tflops
plus whatever extras a suite adds (speedups, bound, bytes_per_doc, ...).
"""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

__all__ = [
    "provenance",
    "time_ms",
    "measure_ceilings",
    "make_row",
    "add_speedups",
    "write_results",
    "print_table",
]

# Buffers for the ceilings: 4 GiB is ~70x the H200's 60 MB L2, so nothing is served from cache.
CEILING_BYTES = 4 << 30
MATMUL_SIZE = 8192


def _commit(root: Path = Path(__file__).resolve().parent.parent) -> str:
    """The commit the measured tree is: TILEMAXSIM_COMMIT, else the tree's .device_commit (a copy
    sent to the device may carry an older .git than the tree), else git's HEAD, else 'unknown'."""
    if os.environ.get("TILEMAXSIM_COMMIT"):
        return os.environ["TILEMAXSIM_COMMIT"]
    marker = root / ".device_commit"
    if marker.exists():
        return marker.read_text().strip()
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=root, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance() -> dict:
    import triton

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
    }
    # What the end-to-end benchmarks run on, when this process has imported it.
    for module, distribution, key in (("transformers", "transformers", "transformers"),
                                      ("colbert", "colbert-ai", "colbert_ai")):
        if module in sys.modules:
            try:
                info[key] = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                info[key] = "unknown (not installed as a distribution)"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sm_count=props.multi_processor_count,
                    gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpu_count=torch.cuda.device_count())
    else:
        info["gpu"] = "none (CPU)"
    return info


def time_ms(fn, warmup_ms: int = 25, rep_ms: int = 200) -> tuple[float, float, float]:
    """Median, 20th and 80th percentile of ``fn``'s time in ms (CUDA events via do_bench)."""
    import triton.testing

    med, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                            quantiles=[0.5, 0.2, 0.8])
    return float(med), float(p20), float(p80)


def round_order(names: list, r: int) -> list:
    """The calls of round ``r`` of alternated timing rounds: ``names`` starting ``r`` further
    on in the same cycle, so no call is always timed first or after the same one. A card that
    clocks down under a run of heavy calls favours whichever comes first: the same launch timed
    fourth in every round came out 5-9 % slower than when timed first
    (results/dense_variants/h100-1d471e8-held-block-fixed-order)."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def rounds_ms(calls: dict, rounds: int, time_fn=None) -> dict:
    """{name: [ms of each round]} of ``calls`` ({name: fn}) timed in ``rounds`` alternated
    rounds in :func:`round_order`; ``time_fn(fn)`` returns (median, ...) ms (:func:`time_ms`
    by default)."""
    time_fn = time_fn or time_ms
    times = {name: [] for name in calls}
    for r in range(rounds):
        for name in round_order(list(calls), r):
            times[name].append(time_fn(calls[name])[0])
    return times


def graph_replay_ms(fn, warmup_ms: int = 50, rep_ms: int = 500) -> float:
    """Median ms of ``fn`` captured in a CUDA graph and replayed: its GPU time alone, without
    the host's launch work (Python, argument checks, one launch per operation)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiled and warm before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)[0]


def fastest(configs, run, check, time_fn=None):
    """(timing, config) of the fastest ``run(config)``; each config's output goes through
    ``check`` (which raises on a wrong result) before it is timed."""
    time_fn = time_fn or time_ms
    best = None
    for config in configs:
        def fn(config=config):
            return run(config)

        check(fn())
        timing = time_fn(fn)
        if best is None or timing[0] < best[0][0]:
            best = (timing, config)
    return best


def measure_ceilings() -> dict:
    """Read bandwidth, copy bandwidth and bf16 matmul rate, measured now on this GPU."""
    n = CEILING_BYTES // 2
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    read_ms = time_ms(lambda: x.sum(dtype=torch.float32))[0]
    copy_ms = time_ms(lambda: y.copy_(x))[0]
    del y
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16)
    mm_ms = time_ms(lambda: a @ b)[0]
    return {
        "read_gbps": CEILING_BYTES / read_ms / 1e6,
        "copy_gbps": 2 * CEILING_BYTES / copy_ms / 1e6,  # bytes read plus bytes written
        "bf16_tflops": 2 * MATMUL_SIZE**3 / mm_ms / 1e9,
    }


def make_row(suite: str, shape: str, provider: str, timing, *, num_docs: int, nbytes: int,
             flops: float, ceilings: dict, **extra) -> dict:
    """``nbytes`` counts every document byte once (plus the queries): the fewest bytes the
    problem must move. ``num_docs`` counts (query, doc) pairs when several queries share docs."""
    ms, p20, p80 = timing
    gbps = nbytes / ms / 1e6
    row = {
        "suite": suite, "shape": shape, "provider": provider,
        "ms": ms, "ms_p20": p20, "ms_p80": p80,
        "docs_per_s": num_docs / ms * 1e3,
        "bytes": nbytes, "gbps": gbps,
        "pct_read_bw": 100.0 * gbps / ceilings["read_gbps"] if ceilings.get("read_gbps") else None,
        "tflops": flops / ms / 1e9,
        "pct_bf16_peak": 100.0 * flops / ms / 1e9 / ceilings["bf16_tflops"]
        if ceilings.get("bf16_tflops") else None,
    }
    row.update(extra)
    return row


def add_speedups(rows: list[dict], ours: str) -> None:
    """For each shape, add ``speedup_vs_<provider>`` to the row of ``ours``."""
    by_shape: dict[tuple, list[dict]] = {}
    for row in rows:
        by_shape.setdefault((row["suite"], row["shape"]), []).append(row)
    for group in by_shape.values():
        mine = [r for r in group if r["provider"] == ours]
        for row in mine:
            for other in group:
                if other["provider"] != ours and other.get("ms"):
                    row[f"speedup_vs_{other['provider']}"] = other["ms"] / row["ms"]


def write_results(rows: list[dict], out_dir, name: str, *, ceilings: dict | None = None,
                  meta: dict | None = None) -> Path:
    """Write ``<name>.json`` (provenance + ceilings + rows) and ``<name>.csv`` (long format)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"provenance": provenance(), "ceilings": ceilings or {}, "meta": meta or {}, "rows": rows}
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    with open(out_dir / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _fmt(value, width: int, digits: int = 3) -> str:
    if value is None:
        return "-".rjust(width)
    if isinstance(value, float):
        return f"{value:.{digits}f}".rjust(width) if abs(value) < 1e5 else f"{value:.3g}".rjust(width)
    return str(value).rjust(width)


def provenance_line(prov: dict, ceilings: dict) -> str:
    """One line naming the GPU, the versions, the commit and the ceilings a run was measured under."""
    return (f"GPU {prov.get('gpu')} | torch {prov['torch']} | triton {prov['triton']} | "
            f"commit {prov['commit'][:10]} | ceilings {ceilings}")


def print_table(rows: list[dict], ours: str | None = None) -> None:
    """Fixed-width table: one line per (shape, provider)."""
    header = (f"{'shape':<40} {'provider':<26} {'ms':>9} {'Mdoc/s':>9} {'GB/s':>8} "
              f"{'%readBW':>8} {'TFLOP/s':>8} {'speedups':<}")
    print(header)
    print("-" * len(header))
    for row in rows:
        speed = " ".join(f"{k[len('speedup_vs_'):]}={v:.2f}x" for k, v in row.items()
                         if k.startswith("speedup_vs_"))
        print(f"{row['shape'][:40]:<40} {row['provider'][:26]:<26} {_fmt(row['ms'], 9)} "
              f"{_fmt(row['docs_per_s'] / 1e6, 9, 1)} {_fmt(row['gbps'], 8, 0)} "
              f"{_fmt(row['pct_read_bw'], 8, 1)} {_fmt(row['tflops'], 8, 1)} {speed}")
