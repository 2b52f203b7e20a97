"""Several queries sharing one document stream: each cell on the roofline, and which unit it saturates.

    python -m experiments.profile_batched time      [CELLS] [--out DIR] [--rep-ms MS]
    python -m experiments.profile_batched ncu       [CELLS] [--out DIR] [--ncu PATH]
    python -m experiments.profile_batched profile   [CELLS] [--out DIR]
    python -m experiments.profile_batched summarize NCU.csv [--launches LAUNCHES.json] [--out DIR]

CELLS is ``--grid RESULT [--count K]``: the K packed cells with B >= 4 (and at least the grid's
TARGET_DOC_BYTES of documents) that a bench_grid result file (.json or .csv) has lowest by % of
their roof; or ``--cell B,Lq,d,dtype,lengths`` repeated (lengths: a bench_grid distribution
name), sized as bench_grid sizes its cells. Issue 25 asks these cells of ``maxsim_packed`` with
a 3-D Q for 70 % of the measured bf16 tensor-core ceiling, and where that is out of reach, the
arithmetic and the saturated unit.

Every cell's inputs are bench_grid's, and the call is bench_grid's: the public op with its
default arguments (``config=None``, ``validate=True``). Its output is checked against the
float64 reference on bench_grid's subset of documents before it is timed or profiled.

``time``: do_bench's median of the call; per cell the FLOPs (2 * B * Lq * T * d, T document
tokens), the bytes (every document byte once, plus the queries), TFLOP/s and TB/s against the
ceilings harness.measure_ceilings measures in the same run, the time each ceiling alone allows,
and the arithmetic intensity against the ridge point (bf16 FLOP/s over read bytes/s): below the
ridge the cell is bound by the read, above it by the tensor cores. A default that splits the
query into several launches reads the documents once per launch; that floor is printed too.

``profile``: every cell once after a warm-up, alone between cudaProfilerStart/Stop, for
``ncu --profile-from-start off``; ``ncu`` runs it under Nsight Compute with the sections and
metrics that name the busy unit, kept to the scoring kernels (``-k``) and exported as CSV. The
profiled launches are numbered in the order the cells ran; ``profile_launches.json`` says which
launches are which cell (a default that splits the query launches the kernel more than once).

``summarize``: per launch of an ncu ``--csv`` export, the throughputs of the SM, memory, DRAM,
L1/TEX and L2, issue slots, the tensor pipe, occupancy, registers and the top warp stall reasons;
metrics it does not know are skipped.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import json
import logging
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch

from . import bench, bench_grid, harness

log = logging.getLogger(__name__)

SUITE = "profile_batched"
TIME_RESULT = "profile_batched"
LAUNCH_RESULT = "profile_launches"
NCU_RESULT = "ncu_summary"
NCU_REPORT = "ncu"  # ncu.ncu-rep (the whole report, for the Nsight Compute GUI) and ncu.csv
MIN_QUERIES = 4  # issue 25's "B >= 4 queries sharing one document stream"
DEFAULT_COUNT = 6

# Nsight Compute's sections that say which unit is busy, and beside them the warp stall reasons
# per issued instruction and the breakdowns of the SM's and L1/TEX's throughput into their units
# (the tensor pipe among the SM's); names the H200's ncu accepts (results/compressed/*/*/
# kernel_ncu.log list what they expand to).
NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy",
                "LaunchStats", "WarpStateStats")
NCU_METRICS = ("regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio",
               "smsp__issue_active.avg.pct_of_peak_sustained_active",
               "breakdown:sm__throughput.avg.pct_of_peak_sustained_active",
               "breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active")
# Where Nsight Compute lives when it is not on PATH (the CUDA images' standalone install).
NCU_GLOBS = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu")


# ---- cells ----

def _number(text):
    """A value of a CSV result file: int, float, bool, None for empty, else the text."""
    if text is None or text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_grid(path) -> tuple[list[dict], dict]:
    """(rows, ceilings) of a bench_grid result file: its JSON, or its long-format CSV (which
    carries no ceilings)."""
    path = Path(path)
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)], {}
    doc = json.loads(path.read_text())
    return doc["rows"], doc.get("ceilings", {})


def lowest_cells(rows: list[dict], count: int = DEFAULT_COUNT,
                 min_queries: int = MIN_QUERIES) -> list[tuple[bench_grid.Cell, dict]]:
    """The ``count`` packed cells of our op with B >= ``min_queries`` and at least
    TARGET_DOC_BYTES of documents that ran, lowest % of their roof first, with their grid rows."""
    ours = [r for r in rows if r.get("provider") == bench.OURS and r.get("status") == "ok"
            and r.get("layout") == "packed" and (r.get("B") or 0) >= min_queries
            and r.get("at_least_10mb") and r.get("pct_roof") is not None]
    ours.sort(key=lambda r: r["pct_roof"])
    return [(bench_grid.Cell(int(r["B"]), int(r["Lq"]), int(r["d"]), r["dtype"], "packed",
                             r["dist"], int(r["N"])), r) for r in ours[:count]]


def parse_cell(spec: str, sizing: bench_grid.Sizing = bench_grid.Sizing()) -> bench_grid.Cell:
    """``B,Lq,d,dtype,lengths`` -> a packed cell with bench_grid's number of documents."""
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != 5:
        raise ValueError(f"--cell {spec!r}: expected B,Lq,d,dtype,lengths")
    try:
        B, Lq, d = (int(p) for p in parts[:3])
    except ValueError:
        raise ValueError(f"--cell {spec!r}: B, Lq and d must be integers") from None
    dtype, dist = parts[3], parts[4]
    if dtype not in bench_grid.DTYPES:
        raise ValueError(f"--cell {spec!r}: dtype must be one of {sorted(bench_grid.DTYPES)}")
    if min(B, Lq, d) < 1:
        raise ValueError(f"--cell {spec!r}: B, Lq and d must be >= 1")
    bench_grid.sample_lengths(dist, 1)  # raises ValueError naming the known distributions
    return bench_grid.Cell(B, Lq, d, dtype, "packed", dist,
                           bench_grid.num_docs(dist, d, dtype, sizing))


def select_cells(args) -> list[tuple[bench_grid.Cell, dict | None]]:
    """The cells the command line names (``--cell``), else the grid's lowest."""
    sizing = bench_grid.Sizing(args.max_docs, args.max_doc_bytes)
    if args.cell:
        return [(parse_cell(spec, sizing), None) for spec in args.cell]
    if not args.grid:
        raise ValueError("name the cells: --grid RESULT or --cell B,Lq,d,dtype,lengths")
    rows, _ = read_grid(args.grid)
    cells = lowest_cells(rows, args.count)
    if not cells:
        raise ValueError(f"{args.grid} has no packed B >= {MIN_QUERIES} row of ours that ran")
    # --max-docs shrinks a grid cell too (the tests' tiny cells).
    return [(dataclasses.replace(c, N=min(c.N, sizing.max_docs)), row) for c, row in cells]


# ---- launches ----

def scoring_kernel_names() -> tuple[str, ...]:
    """The dense ops' scoring kernels: the launched @triton.jit functions of their kernel module."""
    from tilemaxsim_plaid.kernels import maxsim_dense

    return tuple(sorted(n for n in vars(maxsim_dense) if n.startswith("_maxsim")
                        and n.endswith("_kernel")))


def kernel_filter() -> str:
    """ncu's ``-k`` argument matching exactly the scoring kernels."""
    return "regex:^(" + "|".join(map(re.escape, scoring_kernel_names())) + ")$"


def predicted_launches(cell: bench_grid.Cell) -> int:
    """Scoring launches of one default call by the op's own split of the query tokens."""
    from tilemaxsim_plaid.ops.dense import default_query_chunks, tail_joins_head
    from tilemaxsim_plaid.ops.launch import MAX_LQ_PER_LAUNCH

    chunks = default_query_chunks(cell.B, cell.Lq)
    if chunks and tail_joins_head(cell.B, *chunks, None, cell.d, cell.layout == "packed",
                                  cell.N, 4 if cell.dtype == "fp32" else 2):
        return 1
    if chunks:
        return sum(1 for n in chunks if n)
    return math.ceil(cell.Lq / MAX_LQ_PER_LAUNCH)


def _launch_name(metadata):
    data = getattr(metadata, "data", metadata)
    return data.get("name") if isinstance(data, dict) else getattr(metadata, "name", None)


def counted_launches(fn: Callable, names) -> int | None:
    """Launches of the kernels ``names`` in one call of ``fn``, seen by Triton's launch hook;
    None where this Triton has no hook free to take, or nothing was seen (the interpreter
    calls no hook)."""
    import triton

    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    chain = getattr(runtime, "launch_enter_hook", None)
    seen = []

    def hook(metadata):
        seen.append(metadata)

    if hasattr(chain, "add") and hasattr(chain, "remove"):
        chain.add(hook)
        try:
            fn()
        finally:
            chain.remove(hook)
    elif runtime is not None and hasattr(runtime, "launch_enter_hook") and chain is None:
        runtime.launch_enter_hook = hook
        try:
            fn()
        finally:
            runtime.launch_enter_hook = None
    else:
        return None
    count = sum(_launch_name(m) in names for m in seen)
    return count or None


def scoring_launches(cell: bench_grid.Cell, fn: Callable) -> tuple[int, str]:
    """(launches of the scoring kernels in one call, "counted" or "predicted")."""
    predicted = predicted_launches(cell)
    counted = counted_launches(fn, scoring_kernel_names())
    if counted is None:
        return predicted, "predicted"
    if counted != predicted:
        log.warning("[%s] %d scoring launches counted, %d predicted from the op's query split",
                    cell.name, counted, predicted)
    return counted, "counted"


# ---- check, arithmetic, timing ----

def check(cell: bench_grid.Cell, x: bench.Inputs, fn: Callable) -> tuple[float, int]:
    """(max relative error against the float64 reference, NaN when wrong; documents checked) on
    bench_grid's subset: the first documents and the longest."""
    ids = bench_grid.check_subset(cell, x)
    ref = bench_grid.reference_scores(cell, x, ids)
    got = fn().reshape(cell.B, -1)[:, ids.to(x.Q.device)]
    return bench.check_output(bench.OURS, bench_grid.bench_case(cell, x), got, ref), len(ids)


def arithmetic(cell: bench_grid.Cell, x: bench.Inputs, ceilings: dict, launches: int = 1) -> dict:
    """A cell's work against the ceilings: FLOPs, bytes, intensity, the ridge point and the
    time each ceiling alone allows (None without ceilings)."""
    nbytes, flops = bench_grid.bytes_and_flops(cell, x)
    t = x.D_packed if cell.packed else x.D
    doc_bytes = t.numel() * t.element_size()
    read, peak = ceilings.get("read_gbps"), ceilings.get("bf16_tflops")
    out = {"tokens": t.numel() // cell.d, "flops": flops, "bytes": nbytes, "doc_bytes": doc_bytes,
           "intensity": flops / nbytes, "launches": launches,
           "ridge": peak * 1e3 / read if read and peak else None,  # FLOP/byte
           "read_floor_ms": nbytes / read / 1e6 if read else None,
           "tensor_floor_ms": flops / peak / 1e9 if peak else None,
           # Every launch streams the documents once.
           "read_floor_all_launches_ms": (launches * doc_bytes + nbytes - doc_bytes) / read / 1e6
           if read else None}
    out["roofline"] = (None if out["ridge"] is None
                       else "tensor" if out["intensity"] >= out["ridge"] else "read")
    return out


def time_cell(cell: bench_grid.Cell, *, device, ceilings: dict, time_fn: Callable | None,
              grid_row: dict | None = None) -> dict:
    """One row: the cell's check, arithmetic and (with ``time_fn``) timing. A wrong or failing
    call is recorded with its status, not timed."""
    x = bench_grid.make_inputs(cell, device)
    fn = bench_grid.provider_ours(cell, x)
    fields = {**bench_grid.cell_fields(cell, x),
              "grid_pct_roof": grid_row.get("pct_roof") if grid_row else None,
              "grid_ms": grid_row.get("ms") if grid_row else None}
    try:
        err, checked = check(cell, x, fn)
        launches, source = scoring_launches(cell, fn)
    except Exception as exc:  # recorded, so the other cells still run
        log.warning("[%s] failed: %s: %s", cell.name, type(exc).__name__, exc)
        return bench_grid.status_row(cell, bench.OURS, "failed", x, suite=SUITE,
                                     reason=f"{type(exc).__name__}: {str(exc)[:200]}")
    work = arithmetic(cell, x, ceilings, launches)
    fields.update(launches_source=source, max_rel_err=err, checked_docs=checked)
    if math.isnan(err) or time_fn is None:
        status, reason = (("wrong", f"differs from the float64 reference on {checked} documents")
                          if math.isnan(err) else ("checked", "not timed"))
        return {**bench_grid.status_row(cell, bench.OURS, status, x, reason=reason, suite=SUITE),
                **fields, **work}
    row = harness.make_row(SUITE, cell.name, bench.OURS, time_fn(fn), num_docs=cell.B * cell.N,
                           nbytes=work["bytes"], flops=work["flops"], ceilings=ceilings,
                           status="ok", **fields)
    bench_grid.annotate([row], ceilings)  # the grid's bound and % of roof
    row.update(work, tbps=row["gbps"] / 1e3)
    return row


def run_time(cells, out, *, device, ceilings: dict, time_fn: Callable | None,
             meta: dict | None = None) -> Path:
    rows = []
    for cell, grid_row in cells:
        rows.append(time_cell(cell, device=device, ceilings=ceilings, time_fn=time_fn,
                              grid_row=grid_row))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    path = harness.write_results(rows, out, TIME_RESULT, ceilings=ceilings, meta=meta)
    text = time_table(rows, ceilings)
    Path(out, f"{TIME_RESULT}.txt").write_text(text + "\n")
    print(text)
    return path


def _f(value, width: int, digits: int = 1) -> str:
    return "-".rjust(width) if value is None else f"{value:{width}.{digits}f}"


def time_table(rows: list[dict], ceilings: dict) -> str:
    """Fixed-width lines: one per cell, then the ceilings and the ridge they make."""
    head = (f"{'cell':<44} {'status':<7} {'ms':>8} {'GFLOP':>8} {'MB':>7} {'TFLOP/s':>8} "
            f"{'TB/s':>6} {'%bf16':>6} {'%read':>6} {'FLOP/B':>7} {'ridge':>6} {'bound':>6} "
            f"{'%roof':>6} {'grid%':>6} {'launch':>6} {'read ms':>8} {'per-L ms':>8} {'mma ms':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        name = f"B={r['B']} Lq={r['Lq']} d={r['d']} {r['dtype']} {r['dist']} N={r['N']}"
        flops, nbytes = r.get("flops"), r.get("bytes")
        lines.append(
            f"{name[:44]:<44} {r['status']:<7} {_f(r.get('ms'), 8, 4)} "
            f"{_f(flops / 1e9 if flops else None, 8, 1)} {_f(nbytes / 1e6 if nbytes else None, 7, 0)} "
            f"{_f(r.get('tflops'), 8, 1)} {_f(r.get('tbps'), 6, 2)} {_f(r.get('pct_bf16_peak'), 6)} "
            f"{_f(r.get('pct_read_bw'), 6)} {_f(r.get('intensity'), 7, 0)} {_f(r.get('ridge'), 6, 0)} "
            f"{(r.get('roofline') or '-'):>6} {_f(r.get('pct_roof'), 6)} "
            f"{_f(r.get('grid_pct_roof'), 6)} {r.get('launches') or '-':>6} "
            f"{_f(r.get('read_floor_ms'), 8, 4)} {_f(r.get('read_floor_all_launches_ms'), 8, 4)} "
            f"{_f(r.get('tensor_floor_ms'), 8, 4)}")
    read, peak = ceilings.get("read_gbps"), ceilings.get("bf16_tflops")
    if read and peak:
        lines.append(f"ceilings: read {read:.0f} GB/s, bf16 {peak:.1f} TFLOP/s, ridge "
                     f"{peak * 1e3 / read:.0f} FLOP/byte; %roof is the time the binding ceiling "
                     f"allows over the time taken (read ms: the documents read once; per-L ms: "
                     f"once per launch; mma ms: the FLOPs at the bf16 ceiling)")
    return "\n".join(lines)


# ---- profile (under ncu) ----

def run_profile(cells, out, device="cuda") -> tuple[Path, bool]:
    """Check, warm up and profile every cell's call once between cudaProfilerStart/Stop; write
    which ncu launches are which cell. Returns (that file, every cell passed its check)."""
    rows, first, ok = [], 0, True
    for i, (cell, _row) in enumerate(cells):
        x = bench_grid.make_inputs(cell, device)
        fn = bench_grid.provider_ours(cell, x)
        err, checked = check(cell, x, fn)  # also the compile
        row = {"cell": cell.name, "order": i, "B": cell.B, "Lq": cell.Lq, "d": cell.d,
               "dtype": cell.dtype, "dist": cell.dist, "N": cell.N, "max_rel_err": err,
               "checked_docs": checked}
        if math.isnan(err):
            ok = False
            print(f"cell {i}: {cell.name}: WRONG against the float64 reference, not profiled",
                  flush=True)
            rows.append({**row, "launches": 0, "first_id": None, "launches_source": None})
        else:
            launches, source = scoring_launches(cell, fn)  # also the warm-up
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            rows.append({**row, "launches": launches, "first_id": first, "launches_source": source})
            print(f"cell {i}: {cell.name}: ncu launches {first}..{first + launches - 1} "
                  f"({launches} {source})", flush=True)
            first += launches
        del x, fn
        torch.cuda.empty_cache()
    path = harness.write_results(rows, out, LAUNCH_RESULT,
                                 meta={"kernels": list(scoring_kernel_names())})
    return path, ok


def find_ncu() -> str | None:
    """Nsight Compute's command line: on PATH, else its standalone install."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in NCU_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def ncu_command(ncu: str, report: Path, profile_args: list[str], *,
                module: str = "experiments.profile_batched", kernels: str | None = None,
                sections: tuple[str, ...] = NCU_SECTIONS) -> list[str]:
    """ncu over ``module``'s ``profile`` mode: unlocked clocks (as the timed runs), the launches
    matching ``kernels`` only (ncu's ``-k``; default: the dense scoring kernels), one replay per
    metric pass of each kernel, the report kept for the GUI."""
    sections = [a for s in sections for a in ("--section", s)]
    return [ncu, "--clock-control", "none", "--profile-from-start", "off",
            "--replay-mode", "kernel", "--import-source", "no", "-k", kernels or kernel_filter(),
            *sections, "--metrics", ",".join(NCU_METRICS), "--force-overwrite",
            "-o", str(report), sys.executable, "-m", module, "profile", *profile_args]


def export_command(ncu: str, report: Path) -> list[str]:
    return [ncu, "--import", f"{report}.ncu-rep", "--csv", "--page", "details"]


def run_ncu(args, profile_args: list[str], **command) -> int:
    """``ncu_command`` (``command``: its keywords) into ``args.out``/ncu.ncu-rep, then the report's
    details page as ncu.csv; the exit status of the first that failed."""
    ncu = args.ncu or find_ncu()
    if not ncu:
        raise SystemExit("no ncu on PATH nor in " + ", ".join(NCU_GLOBS) + " (--ncu PATH)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = out / NCU_REPORT
    for stale in (Path(f"{report}.ncu-rep"), out / f"{NCU_REPORT}.csv"):
        stale.unlink(missing_ok=True)  # a failed run must not leave an earlier one to summarize
    command = ncu_command(ncu, report, profile_args, **command)
    print("+ " + " ".join(command), flush=True)
    rc = subprocess.run(command).returncode
    if rc != 0:
        print(f"ncu exited {rc}", flush=True)
    if not Path(f"{report}.ncu-rep").exists():
        return rc or 1
    with open(out / f"{NCU_REPORT}.csv", "w") as f:
        exported = subprocess.run(export_command(ncu, report), stdout=f).returncode
    print(f"wrote {out / NCU_REPORT}.csv", flush=True)
    return rc or exported


# ---- summarize an ncu CSV ----

DURATION_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
               "s": 1e6, "second": 1e6}
# Short name -> (ncu's metric name, the unit it must have or None): first found wins.
KNOWN = {
    "duration_us": (("Duration", None), ("gpu__time_duration.sum", None)),
    "sm_pct": (("Compute (SM) Throughput", "%"),),
    "memory_pct": (("Memory Throughput", "%"),),
    "dram_pct": (("DRAM Throughput", "%"),),
    "l1tex_pct": (("L1/TEX Cache Throughput", "%"),),
    "l2_pct": (("L2 Cache Throughput", "%"),),
    "issue_busy_pct": (("Issue Slots Busy", "%"),
                       ("smsp__issue_active.avg.pct_of_peak_sustained_active", "%")),
    "sm_busy_pct": (("SM Busy", "%"),),
    "ipc": (("Executed Ipc Active", None),),
    "l1_hit_pct": (("L1/TEX Hit Rate", "%"),),
    "l2_hit_pct": (("L2 Hit Rate", "%"),),
    "achieved_occupancy_pct": (("Achieved Occupancy", "%"),),
    "theoretical_occupancy_pct": (("Theoretical Occupancy", "%"),),
    "warps_per_sm": (("Achieved Active Warps Per SM", None),),
    "registers": (("Registers Per Thread", None),),
    "shared_kb_per_block": (("Dynamic Shared Memory Per Block", None),),
    "grid_size": (("Grid Size", None),),
    "block_size": (("Block Size", None),),
    "cycles_per_issue": (("Warp Cycles Per Issued Instruction", None),),
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
UNIT_PCT = ".avg.pct_of_peak_sustained_active"
# "selected" is the warp that issued, not a stall.
NOT_STALLS = ("selected",)
TOP = 3


def _value(text: str):
    """A metric value as ncu prints it ("1,500,304", "44.56"), or None ("n/a", "no data")."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_ncu_csv(text: str) -> dict[int, dict]:
    """{result ID: {"kernel": name, "metrics": {metric name: [(section, unit, value)]}}} from an
    ncu ``--csv`` details page; lines before its header (ncu's and the program's output) and
    rows too short or too long for it are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {}
    body = [line for line in lines[start:] if line.startswith('"')]
    reader = csv.reader(body)
    header = next(reader)
    # Rows of metrics without a rule end after "Metric Value" (ncu leaves the rule columns off).
    needed = header.index("Metric Value") + 1 if "Metric Value" in header else len(header)
    results: dict[int, dict] = {}
    for values in reader:
        if not needed <= len(values) <= len(header):
            continue
        row = dict(zip(header, values))
        try:
            rid = int(row["ID"])
        except (KeyError, ValueError):
            continue
        name = row.get("Metric Name")
        if not name:
            continue
        entry = results.setdefault(rid, {"kernel": row.get("Kernel Name") or row.get("Function Name")
                                         or "", "metrics": {}})
        entry["metrics"].setdefault(name, []).append(
            (row.get("Section Name", ""), row.get("Metric Unit", ""), row.get("Metric Value", "")))
    return dict(sorted(results.items()))


def launch_summary(metrics: dict) -> dict:
    """The metrics that say which unit is saturated, from one launch's ``metrics``."""
    out = {}
    for key, candidates in KNOWN.items():
        for name, unit in candidates:
            hit = next(((u, _value(v)) for _s, u, v in metrics.get(name, ())
                        if (unit is None or u == unit) and _value(v) is not None), None)
            if hit is not None:
                u, value = hit
                out[key] = value * DURATION_US[u] if key == "duration_us" and u in DURATION_US else value
                break
        else:
            out[key] = None
    stalls, units = {}, {}
    for name, entries in metrics.items():
        value = next((_value(v) for _s, _u, v in entries if _value(v) is not None), None)
        if value is None:
            continue
        match = STALL.match(name)
        if match and match.group(1) not in NOT_STALLS:
            stalls[match.group(1)] = value
        elif name.endswith(UNIT_PCT) and not name.startswith("smsp__issue_active"):
            units[name[:-len(UNIT_PCT)]] = value
    tensor = {n: v for n, v in units.items() if n.startswith("sm__pipe_tensor")}
    out["tensor_pct"] = max(tensor.values()) if tensor else None
    out["top_stalls"] = sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP]
    out["top_units"] = sorted(units.items(), key=lambda kv: -kv[1])[:TOP]
    candidates = {"SM": out["sm_pct"], "DRAM": out["dram_pct"], "L1/TEX": out["l1tex_pct"],
                  "L2": out["l2_pct"], "issue": out["issue_busy_pct"], "tensor": out["tensor_pct"]}
    candidates.update(out["top_units"][:1])
    known = {k: v for k, v in candidates.items() if v is not None}
    out["busiest"] = max(known.items(), key=lambda kv: kv[1]) if known else None
    return out


def label_launches(ids: list[int], launch_map: list[dict] | None) -> tuple[dict[int, tuple], str]:
    """{ID: (cell, k, n)} in the order the cells ran, and a note when the CSV's launches are not
    the map's (then cells are matched by order as far as they go)."""
    if not launch_map:
        return {i: ("", 1, 1) for i in ids}, ""
    slots = [(m["cell"], k + 1, m["launches"]) for m in launch_map for k in range(m["launches"])]
    note = ("" if len(slots) == len(ids) else
            f"the CSV has {len(ids)} launches, the launch map {len(slots)}: matched by order")
    return {i: slots[j] if j < len(slots) else ("?", 1, 1) for j, i in enumerate(ids)}, note


def summarize_rows(results: dict[int, dict], launch_map: list[dict] | None) -> tuple[list[dict], str]:
    labels, note = label_launches(list(results), launch_map)
    rows = []
    for rid, entry in results.items():
        cell, k, n = labels[rid]
        s = launch_summary(entry["metrics"])
        rows.append({"suite": SUITE, "shape": cell, "provider": bench.OURS, "id": rid,
                     "launch": f"{k}/{n}", "kernel": entry["kernel"], **s,
                     "top_stalls": "; ".join(f"{r} {v:.2f}" for r, v in s["top_stalls"]),
                     "top_units": "; ".join(f"{u} {v:.1f}" for u, v in s["top_units"]),
                     "busiest": f"{s['busiest'][0]} {s['busiest'][1]:.1f} %" if s["busiest"] else None})
    return rows, note


def ncu_table(rows: list[dict], note: str = "") -> str:
    head = (f"{'cell':<40} {'lch':>4} {'us':>8} {'SM%':>5} {'mem%':>5} {'DRAM%':>5} {'L1%':>5} "
            f"{'L2%':>5} {'iss%':>5} {'mma%':>5} {'occ%':>5} {'regs':>4} {'busiest':<22} "
            f"{'top stalls (cycles per issue)':<44} top units")
    lines = [head, "-" * len(head)]
    for r in rows:
        regs = r.get("registers")
        lines.append(
            f"{(r['shape'] or r['kernel'])[:40]:<40} {r['launch']:>4} {_f(r['duration_us'], 8)} "
            f"{_f(r['sm_pct'], 5)} {_f(r['memory_pct'], 5)} {_f(r['dram_pct'], 5)} "
            f"{_f(r['l1tex_pct'], 5)} {_f(r['l2_pct'], 5)} {_f(r['issue_busy_pct'], 5)} "
            f"{_f(r['tensor_pct'], 5)} {_f(r['achieved_occupancy_pct'], 5)} "
            f"{'-' if regs is None else f'{regs:.0f}':>4} {(r['busiest'] or '-')[:22]:<22} "
            f"{(r['top_stalls'] or '-')[:44]:<44} {r['top_units'] or '-'}")
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def summarize(csv_path, out, launches_path=None) -> Path:
    if not Path(csv_path).exists():
        raise SystemExit(f"no ncu CSV at {csv_path} (did the ncu run fail? see its log)")
    results = read_ncu_csv(Path(csv_path).read_text(errors="replace"))
    launch_map = json.loads(Path(launches_path).read_text())["rows"] if launches_path else None
    rows, note = summarize_rows(results, launch_map)
    if not rows:
        log.warning("%s holds no ncu results", csv_path)
    path = harness.write_results(rows, out, NCU_RESULT,
                                 meta={"csv": str(csv_path), "launches": str(launches_path),
                                       "note": note})
    text = ncu_table(rows, note)
    Path(out, f"{NCU_RESULT}.txt").write_text(text + "\n")
    print(text)
    return path


# ---- command line ----

def selection_args(args) -> list[str]:
    """The cell-choosing flags as given, for the ``profile`` run that ncu starts."""
    out = []
    if args.grid:
        out += ["--grid", str(args.grid), "--count", str(args.count)]
    for spec in args.cell:
        out += ["--cell", spec]
    if args.max_docs != bench_grid.MAX_DOCS:
        out += ["--max-docs", str(args.max_docs)]
    if args.max_doc_bytes != bench_grid.MAX_DOC_BYTES:
        out += ["--max-doc-bytes", str(args.max_doc_bytes)]
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.profile_batched",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("time", "profile", "ncu", "summarize"))
    parser.add_argument("csv", nargs="?", help="summarize: the ncu --csv export")
    parser.add_argument("--grid", help="a bench_grid result file (.json or .csv)")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT,
                        help="cells taken from --grid, lowest %% of roof first")
    parser.add_argument("--cell", action="append", default=[], metavar="B,Lq,d,dtype,lengths",
                        help="a packed cell (repeat); replaces --grid")
    parser.add_argument("--max-docs", type=int, default=bench_grid.MAX_DOCS)
    parser.add_argument("--max-doc-bytes", type=int, default=bench_grid.MAX_DOC_BYTES)
    parser.add_argument("--out", default="results/profile/batched")
    parser.add_argument("--device", default="cuda",
                        help="time: cuda; cpu checks the cells under TRITON_INTERPRET=1, untimed")
    parser.add_argument("--rep-ms", type=int, default=bench_grid.TIMING["rep_ms"],
                        help="do_bench's measurement window (default: the grid's)")
    parser.add_argument("--ncu", help="ncu: the Nsight Compute binary (default: found)")
    parser.add_argument("--launches", help="summarize: profile mode's profile_launches.json")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    if args.mode == "summarize":
        if not args.csv:
            parser.error("summarize needs the ncu CSV file")
        print(f"wrote {summarize(args.csv, args.out, args.launches)}")
        return 0
    try:
        cells = select_cells(args)
    except ValueError as exc:
        parser.error(str(exc))
    for cell, row in cells:
        grid = f" (grid: {row['pct_roof']:.1f} % of roof, {row['ms']:.4f} ms)" if row else ""
        log.info("cell %s%s", cell.name, grid)
    if args.mode == "ncu":
        return run_ncu(args, [*selection_args(args), "--out", args.out])
    if (args.device == "cuda" or args.mode == "profile") and not torch.cuda.is_available():
        raise SystemExit(f"{args.mode} needs a CUDA device (time: or --device cpu)")
    if args.mode == "profile":
        path, ok = run_profile(cells, args.out)
        print(f"wrote {path}")
        return 0 if ok else 1
    if args.device == "cuda":
        ceilings = harness.measure_ceilings()
        warmup = bench_grid.TIMING["warmup_ms"]

        def time_fn(fn):
            return harness.time_ms(fn, warmup_ms=warmup, rep_ms=args.rep_ms)
    else:
        ceilings, time_fn = {}, None
    meta = {"grid": args.grid, "cells": [c.name for c, _ in cells], "device": args.device,
            "timing": {"warmup_ms": bench_grid.TIMING["warmup_ms"], "rep_ms": args.rep_ms}}
    if args.grid and Path(args.grid).suffix == ".json":
        meta["grid_ceilings"] = read_grid(args.grid)[1]
    path = run_time(cells, args.out, device=args.device, ceilings=ceilings, time_fn=time_fn,
                    meta=meta)
    doc = json.loads(path.read_text())
    print(harness.provenance_line(doc["provenance"], ceilings))
    print(f"wrote {path}")
    return 0 if all(r["status"] in ("ok", "checked") for r in doc["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
