"""Launch-config sweep over cells of the shape grid, so that the dense defaults can be chosen from
it by rules (issue 25).

    python -m experiments.sweep_configs [--cells NAME] [--budget SECONDS] [--cell-cap S]
                                        [--compile-workers K] [--max-configs K] [--out DIR]
                                        [--device cuda|cpu] [--dry-run]

A cell is bench_grid's Cell, named, sized (N, bytes) and filled (make_inputs) as the grid does, so
the numbers compare with the grid's. Per cell, in this order: the default call
(``maxsim_packed`` / ``maxsim_padded`` with ``config=None``) with ``validate=True`` and with
``validate=False``, then the cell's designed candidate MaxSimConfigs (``validate=False``; see
candidates()). Every call is first checked once against the float64 reference on the grid's
subset of documents (bench_grid.check_subset; bench.check_output's tolerance for ours): a wrong
config is recorded as ``wrong``, logged as an error, listed in the summary and makes the exit
status 1; it is never timed. A config that is refused, fails to compile or runs out of resources
is recorded as ``failed`` with its error and skipped. That first call holds the compile and is
not timed (its wall time is ``first_call_s``); the timing is bench_grid's (do_bench medians).
After the pass, the validate=False default and the fastest few candidates are timed again in
alternated rounds (rematch()), and their speed-ups are read from those rounds' medians.

Cells run in priority order (the weakest cells of the last grid first) until the budget is spent,
each for at most ``--cell-cap`` seconds; what is left is recorded as ``not_run``. Compiles are
most of a cell's wall time, so on a GPU ``--compile-workers`` processes first compile every
(cell, config) of the run into Triton's on-disk cache, in the same priority order and within
COMPILE_SHARE of the budget; the main process's first calls then load the kernels. Nothing is
timed while the workers run, and a config that failed in a worker is recorded from there and not
launched again.

Rows (one per cell and call, long format, harness.write_results: ``sweep.json`` / ``sweep.csv``)
carry the grid's columns (bench_grid.annotate's ``pct_roof`` and ``bound``), the config's fields
as ``cfg_*`` (for the default calls: what default_config chose), ``validate`` and
``speedup_vs_default`` (the validate=False default's ms over the row's; ``ms_rematch`` where
both were rematched). The summary printed last
ranks the candidates across cells, then one line per cell: default ms and % roof, best config ms
and % roof, its fields, the speed-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import torch

from . import bench, bench_grid as bg, harness
from tilemaxsim_plaid.ops.dense import (MAX_BLOCK_D, MaxSimConfig, default_config, maxsim_packed,
                                        maxsim_padded)
from tilemaxsim_plaid.ops.launch import memory_bandwidth

log = logging.getLogger(__name__)

SUITE = "dense_config_sweep"
RESULT_NAME = "sweep"
DEFAULT = f"{bench.OURS} default"
DEFAULT_NO_VALIDATE = f"{bench.OURS} default validate=False"

# The weak cells of the last grid (packed one query at d = 128 away from Lq = 32; d away from 128;
# the length distributions away from log-normal 70; packed B = 4 and 32), worst first, then the
# headline and padded B = 1 / 4 as controls. Each is a change to bench_grid.HEADLINE; N and the
# name are the full grid's.
WEAK = (
    {"d": 144}, {"dist": "lognormal-30"}, {"B": 4}, {"B": 32}, {"d": 768},
    {"Lq": 33}, {"Lq": 64}, {"d": 64}, {"d": 96},
    {"Lq": 1}, {"Lq": 8}, {"Lq": 16}, {"Lq": 17}, {"Lq": 31}, {"d": 384},
    {"dist": "lognormal-150"}, {"dist": "uniform-1-300"}, {"dist": "heavy-512"},
    {},
    {"layout": "padded", "dist": bg.PADDED_DIST},
    {"B": 4, "layout": "padded", "dist": bg.PADDED_DIST},
)
# The cells still weak in the grid after the first sweep's rules: 64-row query blocks over
# padded documents and wide d, d = 96 away from Lq = 32, short documents.
SECOND = (
    {"Lq": 64, "layout": "padded", "dist": bg.PADDED_DIST},
    {"Lq": 33, "d": 384}, {"Lq": 64, "d": 384}, {"Lq": 33, "d": 96}, {"d": 96},
    {"dist": "lognormal-30"}, {"Lq": 33},
)
# The weak cells of the full grid (run 106): d = 144 past 32 query tokens, d = 256, padded
# documents of 180 tokens, four queries of 33 tokens.
THIRD = (
    {"Lq": 48, "d": 144}, {"Lq": 64, "d": 144}, {"Lq": 31, "d": 256}, {"Lq": 24, "d": 256},
    {"d": 256}, {"layout": "padded", "dist": "fixed-180"}, {"B": 4, "Lq": 33},
)
# After the third set: d = 144 under 17 query tokens, d = 192, d = 64 past 32 tokens, short
# documents.
FOURTH = (
    {"Lq": 16, "d": 144}, {"Lq": 1, "d": 144}, {"d": 192}, {"Lq": 48, "d": 192},
    {"Lq": 33, "d": 64}, {"dist": "lognormal-30"},
)
# The cells below target in the full grid of run 112: short padded documents (0.84x
# flash-maxsim at 32 tokens), d = 256 and 512 over long documents (0.92-0.99x), d = 384 at 24-32
# query tokens, short varied documents, and d = 256 at Lq = 32 (slower in run 113).
FIFTH = (
    {"layout": "padded", "dist": "fixed-32"}, {"layout": "padded", "dist": "fixed-64"},
    {"d": 256, "dist": "lognormal-150"}, {"d": 256, "dist": "uniform-1-300"},
    {"d": 512, "dist": "lognormal-150"}, {"d": 384}, {"Lq": 24, "d": 384},
    {"dist": "lognormal-30"}, {"d": 64, "dist": "lognormal-30"}, {"d": 256},
)
# One query of 33-64 tokens (a 64-row query block over 4 warps, a warpgroup product), d = 128
# first.
WIDE = ({"Lq": 64}, {"Lq": 33}, {"Lq": 64, "d": 64}, {"Lq": 48, "d": 96}, {"Lq": 64, "d": 256})
# Several queries sharing packed documents (issue 25's tensor-ceiling target), longest first.
MULTI = ({"B": 32}, {"B": 4, "Lq": 64}, {"B": 4}, {"B": 16}, {"B": 32, "Lq": 64})
# The weakest packed one-query cells of the full grid of run 117: one query of 33-64 tokens at
# d = 144 (66 % of the read roof), 64 and 256.
SIXTH = ({"Lq": 64, "d": 144}, {"Lq": 33, "d": 144}, {"Lq": 64, "d": 64}, {"Lq": 64, "d": 256})
# Short documents walked as one loop by one warp (the flat kernel, which the sweeps above
# predate): the last packed one-query cells under 90 % of the read roof on an H100 (run 196).
SEVENTH = ({"d": 64, "dist": "lognormal-30"}, {"dist": "lognormal-30"})
# Cells at the read roof where a peer was faster on an H100 (run 201, 0.970-0.985x): the
# headline, d = 512 and 256 over long varied documents, padded documents of 180 tokens, padded
# d = 160.
EIGHTH = ({}, {"d": 512, "dist": "lognormal-150"}, {"d": 256, "dist": "uniform-1-300"},
          {"layout": "padded", "dist": "fixed-180"},
          {"d": 160, "layout": "padded", "dist": bg.PADDED_DIST})
# Two cells of the grid for a CPU run under the interpreter: packed one query, padded four.
SMOKE = ({"Lq": 8}, {"B": 4, "layout": "padded", "dist": bg.PADDED_DIST})
CELL_SETS = {"weak": WEAK, "second": SECOND, "third": THIRD, "fourth": FOURTH, "fifth": FIFTH,
             "sixth": SIXTH, "seventh": SEVENTH, "eighth": EIGHTH, "wide": WIDE, "multi": MULTI, "smoke": SMOKE}

# After a cell's single pass, its validate=False default and the REMATCH_TOP fastest candidates
# are timed again in REMATCH_ROUNDS alternated rounds, and their speed-ups come from the round
# medians: a config timed at two places in one pass moved by up to 20 % (run 116).
REMATCH_TOP, REMATCH_ROUNDS = 3, 3
# Seconds of wall time one cell may take (its reference, checks, timings and in-process compiles):
# ~25 candidates at bench_grid's timing window each, with room for a few compiles.
CELL_CAP_S = 30.0
# Share of the budget the compile workers may take before the timing starts.
COMPILE_SHARE = 0.5
# Configs per compile job: small enough to spread a cell's compiles over the workers.
COMPILE_CHUNK = 6
# A multiprocessing pool never finishes the job of a worker that died abruptly: when no job has
# finished for this long (a job is a few compiles of seconds each), the rest is left to the main
# process.
COMPILE_STALL_S = 45.0


# ---- cells ----

def select_cells(cell_set: str, sizing: bg.Sizing = bg.Sizing()) -> list[bg.Cell]:
    """The set's cells, in its order, exactly as bench_grid.build_cells("full") names and sizes
    them."""
    if cell_set not in CELL_SETS:
        raise ValueError(f"cells must be one of {sorted(CELL_SETS)}, got {cell_set!r}")
    by_key = {c.key: c for c in bg.build_cells("full", sizing)}
    keys = ("B", "Lq", "d", "dtype", "layout", "dist")
    cells = []
    for change in CELL_SETS[cell_set]:
        p = {**bg.HEADLINE, **change}
        key = tuple(p[k] for k in keys)
        if key not in by_key:
            raise ValueError(f"cell {p} is not in bench_grid's full grid")
        cells.append(by_key[key])
    return cells


# ---- candidates ----

def _cfg(block_t, num_warps, num_stages, docs=1, *, hold=False, rows=None, lq=32, B=1, qbpp=1,
         slots=False, single=False, block_d=None) -> MaxSimConfig:
    """A config; ``rows`` query rows per product become queries_per_block for this Lq and B."""
    qpb = 1 if rows is None else max(1, min(_pow2(B), rows // lq))
    qbpp = max(1, min(qbpp, -(-B // qpb)))  # no more query blocks per program than there are
    return MaxSimConfig(block_t=block_t, queries_per_block=qpb, q_blocks_per_program=qbpp,
                        docs_per_program=docs, single_tile=single, num_warps=num_warps,
                        num_stages=num_stages, slots=slots, hold_query=hold, block_d=block_d)


def _pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _one_query_packed(cell: bg.Cell) -> list[MaxSimConfig]:
    """B = 1, packed: around the many-documents default (16-token tiles, one warp, three stages,
    the query held across 16 documents) one axis at a time, then the alternatives for long
    documents (wider tiles, more warps), short ones (slots, more documents per program), Lq > 32
    (a 64-row held query: more warps) and wide or odd d (block_d chunks, the query held one tile
    per chunk or read per document)."""
    one_chunk = cell.d <= MAX_BLOCK_D
    held = [
        _cfg(16, 1, 2, 16, hold=True), _cfg(16, 1, 4, 16, hold=True),  # stages
        _cfg(16, 1, 3, 4, hold=True), _cfg(16, 1, 3, 32, hold=True),  # documents per program
        _cfg(16, 2, 3, 16, hold=True), _cfg(16, 4, 3, 16, hold=True),  # warps
        _cfg(32, 1, 3, 16, hold=True), _cfg(32, 2, 3, 16, hold=True),  # tiles
        _cfg(32, 2, 2, 4, hold=True), _cfg(64, 2, 3, 8, hold=True), _cfg(64, 4, 3, 4, hold=True),
    ]
    if cell.Lq > 32:
        # A 64-row block: more warps per product; fewer stages or shorter tiles for more
        # programs per SM (41 KB of shared memory each at t32 s3).
        held += [_cfg(16, 2, 4, 16, hold=True), _cfg(32, 4, 3, 8, hold=True),
                 _cfg(32, 4, 2, 8, hold=True), _cfg(16, 4, 3, 8, hold=True)]
    plain = [
        _cfg(32, 2, 2),  # the few-documents default
        _cfg(16, 1, 3, 16), _cfg(32, 2, 3), _cfg(32, 4, 3), _cfg(64, 4, 2), _cfg(64, 4, 3),
        _cfg(128, 4, 2), _cfg(16, 1, 3, 4), _cfg(32, 2, 3, 4),
    ]
    slots = [_cfg(16, 2, 2, 4, slots=True), _cfg(16, 4, 2, 8, slots=True),
             _cfg(32, 2, 2, 2, slots=True), _cfg(32, 4, 3, 4, slots=True)]
    # Narrower d chunks on the paths that walk several: no masked column at d = 96 (3 x 32) and
    # 144 (9 x 16; 4 x 32 + 16), smaller pipelined chunks at 320 - 768. They are what these
    # cells are weak for, so they come right after the held query.
    chunked = []
    for block_d in {96: (32,), 144: (16, 32), 192: (32, 64), 256: (128, 64), 320: (64,),
                     384: (64, 32), 512: (64, 128), 640: (64,), 768: (64,)}.get(cell.d, ()):
        # The query held as one register tile per chunk: one warp while it fits (d <= 256:
        # 127 registers at 64-column chunks, no spill under triton 3.6), four warps over wider d
        # (a [32, 384] fp16 block is 192 registers a lane in one warp).
        held_chunked = ((_cfg(16, 1, 3, 4, hold=True), _cfg(16, 2, 3, 4, hold=True),
                         _cfg(32, 4, 3, 8, hold=True))
                        if cell.d <= 256 else
                        (_cfg(32, 4, 3, 4, hold=True), _cfg(64, 4, 3, 4, hold=True),
                         _cfg(32, 4, 3, 8, hold=True)))
        chunked += [dataclasses.replace(c, block_d=block_d) for c in
                    (*held_chunked, _cfg(32, 2, 2), _cfg(32, 2, 3), _cfg(16, 1, 3, 16),
                     _cfg(64, 4, 3), _cfg(32, 2, 3, 4), _cfg(16, 2, 2, 4, slots=True))]
    if cell.Lq > 32 and not one_chunk:
        # A 64-row query block over wide d: more warps per product, each chunk width.
        chunked = [_cfg(t, w, 3, block_d=bd) for bd in (64, 128) for t, w in ((32, 4), (64, 4), (16, 2))
                   ] + chunked
    return (held if one_chunk else []) + chunked + plain + slots


def _several_queries_packed(cell: bg.Cell) -> list[MaxSimConfig]:
    """B >= 4, packed: slots (documents side by side) and per-document tiles, over query rows
    per product (64 / 128 / 256), query blocks per program, documents per program or slot, tile
    length, warps and stages; then a 128-row query block held in registers across several
    documents (hold_query, one query block a program), as one query over many documents is."""
    k = dict(lq=_pow2(cell.Lq), B=cell.B)
    held = [_cfg(t, w, s, docs, hold=True, rows=128, **k)
            for t, w, s, docs in ((32, 4, 3, 8), (32, 8, 3, 8), (64, 8, 3, 4), (16, 4, 3, 16),
                                  (32, 4, 3, 4), (64, 4, 2, 4))]
    return held + [
        _cfg(32, 8, 2, 2, rows=128, slots=True, **k), _cfg(32, 4, 3, 2, rows=128, slots=True, **k),
        _cfg(32, 8, 3, 2, rows=128, slots=True, **k), _cfg(32, 8, 2, 4, rows=128, slots=True, **k),
        _cfg(16, 4, 2, 4, rows=128, slots=True, **k), _cfg(16, 8, 2, 8, rows=128, slots=True, **k),
        _cfg(64, 8, 2, 2, rows=128, slots=True, **k), _cfg(64, 4, 3, 1, rows=128, slots=True, **k),
        _cfg(128, 8, 2, 1, rows=128, slots=True, **k), _cfg(32, 4, 2, 4, rows=64, slots=True, **k),
        _cfg(32, 8, 2, 2, rows=256, slots=True, **k),
        _cfg(64, 4, 2, rows=128, **k), _cfg(64, 4, 3, rows=128, qbpp=2, **k),
        _cfg(128, 8, 2, rows=128, **k), _cfg(128, 8, 3, rows=128, **k),
        _cfg(32, 4, 3, rows=128, **k), _cfg(64, 8, 2, rows=128, qbpp=8, **k),
        _cfg(64, 4, 2, 4, rows=128, **k), _cfg(128, 8, 3, rows=128, qbpp=8, **k),
        _cfg(64, 8, 2, rows=256, **k),
    ]


def _padded(cell: bg.Cell) -> list[MaxSimConfig]:
    """Padded controls: the tile and warp axes around the default, the held query for one query;
    single tiles for several."""
    if cell.B == 1:
        longer = [_cfg(32, 4, 3, 8, hold=True), _cfg(64, 4, 3), _cfg(128, 8, 3), _cfg(64, 8, 2),
                  _cfg(32, 4, 2, 4, hold=True)] if cell.Lq > 32 else []
        # Short documents: the query held across many of them (reloaded per document it is as
        # many bytes from L2 as a 32-token document is from HBM).
        short = [_cfg(32, 1, 3, 16, hold=True), _cfg(32, 2, 3, 16, hold=True),
                 _cfg(32, 4, 3, 8, hold=True), _cfg(16, 1, 3, 32, hold=True)
                 ] if bg.padded_length(cell.dist) <= 64 else []
        # Documents of a fixed whole number of tiles: with a running max no tile is masked.
        short += [dataclasses.replace(c, running_max=True) for c in short[:2]]
        return [_cfg(64, 4, 2), _cfg(128, 8, 2), _cfg(128, 4, 3), _cfg(32, 2, 2),
                _cfg(16, 1, 3, 16, hold=True), _cfg(32, 2, 3, 4, hold=True),
                _cfg(64, 4, 3, 4, hold=True)] + short + longer
    k = dict(lq=_pow2(cell.Lq), B=cell.B)
    ld = bg.padded_length(cell.dist)
    single = [_cfg(_pow2(ld), w, s, docs, rows=128, single=True, **k)
              for w, s, docs in ((8, 2, 1), (4, 3, 1), (4, 2, 2))] if ld <= 128 else []
    return single + [_cfg(64, 4, 2, rows=128, **k), _cfg(128, 8, 3, rows=128, **k)]


def candidates(cell: bg.Cell) -> list[MaxSimConfig]:
    """The designed candidate list of a cell (not the product of the axes), most likely first,
    each config once."""
    if not cell.packed:
        found = _padded(cell)
    elif cell.B == 1:
        found = _one_query_packed(cell)
    else:
        found = _several_queries_packed(cell)
    return list(dict.fromkeys(found))


def label(config: MaxSimConfig) -> str:
    """A short name: path, tile, warps, stages, then what differs from one query per block."""
    path = ("slots" if config.slots else "single" if config.single_tile
            else "hold" if config.hold_query else "tiles")
    parts = [path, f"t{config.block_t}", f"w{config.num_warps}", f"s{config.num_stages}",
             f"docs{config.docs_per_program}"]
    if config.queries_per_block != 1:
        parts.append(f"q{config.queries_per_block}")
    if config.q_blocks_per_program != 1:
        parts.append(f"qb{config.q_blocks_per_program}")
    if config.block_d is not None:
        parts.append(f"bd{config.block_d}")
    if config.running_max:
        parts.append("rm")
    return " ".join(parts)


def config_fields(config: MaxSimConfig | None) -> dict:
    return {f"cfg_{k}": v for k, v in (dataclasses.asdict(config) if config else {}).items()}


def chosen_default(cell: bg.Cell, x: bench.Inputs, validate: bool) -> MaxSimConfig:
    """What the op's default_config picks for this call (packed without validation: no
    max_doc_len, as the op sees it)."""
    max_len = int(x.lengths.max()) if x.lengths.numel() else 0
    if cell.packed and not validate:
        max_len = None
    elif not cell.packed and not validate:
        max_len = x.D.shape[1]
    element_size = x.Q.element_size()
    return default_config(cell.B, cell.Lq, max_len, cell.d, variable_lengths=cell.packed,
                          num_docs=cell.N, element_size=element_size,
                          mean_tokens=x.D_packed.shape[0] / cell.N if cell.packed else None,
                          read_bandwidth=memory_bandwidth(x.Q.device))


# ---- calls ----

def make_call(cell: bg.Cell, x: bench.Inputs, config: MaxSimConfig | None, validate: bool):
    """The public op as the grid calls it (a 2-D query for B = 1), with this config."""
    Q = x.Q[0] if cell.B == 1 else x.Q
    if cell.packed:
        return lambda: maxsim_packed(Q, x.D_packed, x.offsets, config=config, validate=validate)
    return lambda: maxsim_padded(Q, x.D, config=config, validate=validate)


# One call of a cell: (provider, config or None for the default, validate).
Call = tuple[str, "MaxSimConfig | None", bool]


def plan(cell: bg.Cell, max_configs: int | None = None) -> list[Call]:
    """The calls of a cell, in order: the two default calls, then its candidates."""
    found = candidates(cell)[:max_configs]
    return ([(DEFAULT, None, True), (DEFAULT_NO_VALIDATE, None, False)] +
            [(f"{bench.OURS} {label(c)}", c, False) for c in found])


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _is_cuda_fault(text: str) -> bool:
    """An error after which this process's CUDA context is unusable (nothing else may run)."""
    return any(s in text for s in ("illegal memory access", "misaligned address",
                                   "unspecified launch failure", "device-side assert"))


def compile_jobs(cell: bg.Cell, jobs: list, device: str = "cuda") -> dict:
    """Worker: call each (provider, config, validate) once on the cell's inputs, so its kernels
    land in Triton's on-disk cache. Returns {provider: error} for the calls that failed; after a
    fault that leaves the CUDA context unusable, the rest are left to the main process."""
    x = bg.make_inputs(cell, device)
    errors = {}
    for provider, config, validate in jobs:
        try:
            make_call(cell, x, config, validate)()
            if device == "cuda":
                torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            continue  # the workers' inputs together, not the config: left to the main process
        except Exception as exc:  # recorded by the main process, which does not launch it again
            errors[provider] = _error(exc)
            if _is_cuda_fault(errors[provider]):
                break
    return errors


def precompile(cells: list[bg.Cell], plans: dict, *, workers: int, deadline: float, device: str,
               clock=time.monotonic) -> dict:
    """Compile every planned call in ``workers`` spawned processes until ``deadline``. Returns
    {(cell name, provider): error} of the calls that failed there; the processes still running at
    the deadline are terminated (they started here), so that nothing else uses the GPU while the
    main process times."""
    errors: dict = {}
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(workers)
    pending = []
    try:
        for cell in cells:
            calls = plans[cell.name]
            for i in range(0, len(calls), COMPILE_CHUNK):
                chunk = calls[i:i + COMPILE_CHUNK]
                pending.append((cell, pool.apply_async(compile_jobs, (cell, chunk, device))))
        done = 0
        progress = clock()
        while pending and clock() < deadline:
            if clock() - progress > COMPILE_STALL_S:
                log.warning("no compile job finished in %.0f s: stopping the workers",
                            COMPILE_STALL_S)
                break
            still = []
            for cell, result in pending:
                if not result.ready():
                    still.append((cell, result))
                    continue
                done += 1
                progress = clock()
                try:
                    errors.update({(cell.name, p): e for p, e in result.get().items()})
                except Exception as exc:  # a worker that died: the main process compiles
                    log.warning("compile worker failed on %s: %s", cell.name, _error(exc))
            pending = still
            time.sleep(0.05)
        if pending:
            log.warning("%d of %d compile jobs left to the main process", len(pending),
                        len(pending) + done)
    finally:
        pool.terminate()
        pool.join()
    return errors


# ---- one cell ----

def run_cell(cell: bg.Cell, calls: list, ceilings: dict, *, device, time_fn, clock,
             deadline: float, cell_cap_s: float, worker_errors: dict | None = None,
             call_factory=make_call) -> list[dict]:
    """Check and time every (provider, config, validate) of ``calls`` on ``cell``."""
    began = clock()
    cap = min(deadline, began + cell_cap_s)
    x = bg.make_inputs(cell, device)
    nbytes, flops = bg.bytes_and_flops(cell, x)
    ids = bg.check_subset(cell, x)
    ref = bg.reference_scores(cell, x, ids)
    case = bg.bench_case(cell, x)
    fields = bg.cell_fields(cell, x)
    log.info("[%s] %d calls, doc bytes %.1f MB", cell.name, len(calls), fields["doc_bytes"] / 1e6)
    worker_errors = worker_errors or {}
    rows = []
    fns = {}
    fault = ""
    for provider, config, validate in calls:
        chosen = config if config is not None else chosen_default(cell, x, validate)
        extra = dict(validate=validate, config=label(chosen), explicit=config is not None,
                     **config_fields(chosen))

        def status(state, reason, **more):
            row = bg.status_row(cell, provider, state, x, reason=reason, **extra, **more)
            row["suite"] = SUITE
            rows.append(row)

        if fault:
            status("not_run", f"the CUDA context is unusable after: {fault}")
            continue
        if clock() > cap:
            status("not_run", "time budget spent" if clock() > deadline else "cell cap spent")
            continue
        if (cell.name, provider) in worker_errors:
            status("failed", f"in the compile worker: {worker_errors[cell.name, provider]}")
            continue
        try:
            fn = call_factory(cell, x, config, validate)
            first = time.perf_counter()
            got = fn().reshape(cell.B, -1)[:, ids.to(x.Q.device)]
            err = bench.check_output(provider, case, got, ref)
            first_call_s = time.perf_counter() - first
            if math.isnan(err):
                log.error("WRONG: %s on %s differs from the float64 reference: not timed",
                          provider, cell.name)
                status("wrong", f"differs from the float64 reference on {len(ids)} documents",
                       first_call_s=first_call_s)
                continue
            timing = time_fn(fn)
        except Exception as exc:  # refused, failed to compile, out of resources: recorded
            reason = _error(exc)
            log.warning("  %s failed: %s", provider, reason)
            status("failed", reason)
            if _is_cuda_fault(reason):
                fault = reason
            continue
        row = harness.make_row(SUITE, cell.name, provider, timing, num_docs=cell.B * cell.N,
                               nbytes=nbytes, flops=flops, ceilings=ceilings, status="ok",
                               **fields, **extra, max_rel_err=err, checked_docs=len(ids),
                               first_call_s=first_call_s)
        log.info("  %-52s %9.4f ms  %s %% read BW", provider, row["ms"],
                 "-" if row["pct_read_bw"] is None else f"{row['pct_read_bw']:.1f}")
        rows.append(row)
        fns[provider] = fn
    if not fault and clock() < deadline:
        rematch(rows, fns, time_fn)
    annotate(rows, ceilings)
    del x
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def rematch(rows: list[dict], fns: dict, time_fn) -> None:
    """Time the cell's validate=False default and its REMATCH_TOP fastest candidates again, in
    REMATCH_ROUNDS rounds of each in turn; each gets ``rematch_ms`` (the rounds) and
    ``ms_rematch`` (their median)."""
    ok = [r for r in rows if r["status"] == "ok" and r["provider"] in fns]
    base = [r for r in ok if r["provider"] == DEFAULT_NO_VALIDATE]
    top = sorted((r for r in ok if r.get("explicit")), key=lambda r: r["ms"])[:REMATCH_TOP]
    group = base + top
    if len(group) < 2:
        return
    for row in group:
        row["rematch_ms"] = []
    for r in range(REMATCH_ROUNDS):
        for row in harness.round_order(group, r):
            row["rematch_ms"].append(time_fn(fns[row["provider"]])[0])
    for row in group:
        row["ms_rematch"] = statistics.median(row["rematch_ms"])


def _speed_ms(row: dict) -> float:
    """A row's time for comparisons: its rematch median where it has one."""
    return row.get("ms_rematch") or row["ms"]


def annotate(rows: list[dict], ceilings: dict) -> None:
    """bench_grid's bound and % of roof, and each timed row's speed-up over the validate=False
    default of its cell (> 1: faster than the default), from the rematch medians where both
    rows have them, else from the single pass."""
    bg.annotate(rows, ceilings)
    base = {r["shape"]: r for r in rows
            if r["provider"] == DEFAULT_NO_VALIDATE and r["status"] == "ok"}
    for row in rows:
        ref = base.get(row["shape"])
        if not ref or row["status"] != "ok":
            row["speedup_vs_default"] = None
        elif "ms_rematch" in row and "ms_rematch" in ref:
            row["speedup_vs_default"] = ref["ms_rematch"] / row["ms_rematch"]
        else:
            row["speedup_vs_default"] = ref["ms"] / row["ms"]


# ---- the run ----

def run(cells: list[bg.Cell], out, *, ceilings: dict | None = None, budget_s: float,
        cell_cap_s: float = CELL_CAP_S, compile_workers: int = 0, max_configs: int | None = None,
        device="cuda", time_fn=bg.gpu_ms, clock=time.monotonic, start: float | None = None,
        meta: dict | None = None, plan_fn=plan, call_factory=make_call) -> Path:
    """Sweep ``cells`` in order until ``budget_s`` (from ``start``) is spent, writing the rows
    after every cell. ``ceilings`` None: measured after the compile workers are done. Returns
    the JSON's path."""
    start = clock() if start is None else start
    deadline = start + budget_s
    plans = {c.name: plan_fn(c, max_configs) for c in cells}
    worker_errors: dict = {}
    if compile_workers > 0 and cells:
        began = clock()
        worker_errors = precompile(cells, plans, workers=compile_workers, device=device,
                                   deadline=start + COMPILE_SHARE * budget_s, clock=clock)
        log.info("compile workers: %.0f s, %d calls failed there", clock() - began,
                 len(worker_errors))
    if ceilings is None:
        ceilings = harness.measure_ceilings() if device == "cuda" else {}
    meta = dict(meta or {})
    meta.update(budget_s=budget_s, cell_cap_s=cell_cap_s, compile_workers=compile_workers,
                planned_cells=len(cells), planned_calls=sum(map(len, plans.values())),
                timing=bg.TIMING)
    rows: list[dict] = []
    for i, cell in enumerate(cells):
        if clock() > deadline:
            for rest in cells[i:]:
                for provider, config, validate in plans[rest.name]:
                    row = bg.status_row(rest, provider, "not_run", reason="time budget spent",
                                        validate=validate, explicit=config is not None,
                                        config=label(config) if config else None,
                                        **config_fields(config))
                    row["suite"] = SUITE
                    rows.append(row)
            log.warning("time budget of %.0f s spent: %d of %d cells not run (recorded)",
                        budget_s, len(cells) - i, len(cells))
            break
        rows += run_cell(cell, plans[cell.name], ceilings, device=device, time_fn=time_fn,
                         clock=clock, deadline=deadline, cell_cap_s=cell_cap_s,
                         worker_errors=worker_errors, call_factory=call_factory)
        meta.update(cells_run=i + 1, not_run=[c.name for c in cells[i + 1:]],
                    elapsed_s=clock() - start)
        harness.write_results(rows, out, RESULT_NAME, ceilings=ceilings, meta=meta)
    ran = {r["shape"] for r in rows if r["status"] != "not_run"}
    meta.update(cells_run=len(ran), not_run=[c.name for c in cells if c.name not in ran],
                elapsed_s=clock() - start)
    return harness.write_results(rows, out, RESULT_NAME, ceilings=ceilings, meta=meta)


# ---- summary ----

def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# Candidates listed per class of cells in the summary's ranking.
RANKED = 12


def cell_class(row: dict) -> str:
    """The classes default_config's rules separate: one query or several, packed or padded."""
    return f"{row['layout']} {'B=1' if row['B'] == 1 else 'B>=4'}"


def summary(doc: dict) -> list[str]:
    """The lines printed last: coverage and failures, the candidates ranked across the cells
    (geometric-mean speed-up over the default where they ran), then the table of cells."""
    rows = doc["rows"]
    cells = list(dict.fromkeys(r["shape"] for r in rows))
    ran = {r["shape"] for r in rows if r["status"] != "not_run"}
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = [f"cells: {len(ran)} of {len(cells)} run; calls by status: " +
             ", ".join(f"{s}={n}" for s, n in sorted(counts.items()))]
    for r in rows:
        if r["status"] == "wrong":
            lines.append(f"  WRONG {r['provider']} on {r['shape']}: {r.get('reason')}")
    for r in rows:
        if r["status"] == "failed":
            lines.append(f"  failed {r['provider']} on {r['shape']}: {r.get('reason')}")

    by_config: dict[tuple, list[float]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get("explicit") and r.get("speedup_vs_default"):
            key = (cell_class(r), r["config"])
            by_config.setdefault(key, []).append(r["speedup_vs_default"])
    for group in dict.fromkeys(k[0] for k in by_config):
        ranked = sorted(((name, v) for (g, name), v in by_config.items() if g == group),
                        key=lambda kv: -statistics.geometric_mean(kv[1]))
        lines.append(f"{group}: candidates by geometric-mean speed-up over the default "
                     f"(cells where run):")
        lines += [f"  {statistics.geometric_mean(v):6.3f}x  min {min(v):5.3f}x  max {max(v):5.3f}x"
                  f"  {len(v):3d} cells  {name}" for name, v in ranked[:RANKED]]

    header = (f"{'cell':<58} {'default ms':>10} {'%roof':>6} {'no-val ms':>9} {'best ms':>9} "
              f"{'%roof':>6} {'speedup':>7}  best config (default's config)")
    lines += [header, "-" * len(header)]
    for shape in cells:
        group = [r for r in rows if r["shape"] == shape]
        timed = [r for r in group if r["status"] == "ok"]
        default = next((r for r in timed if r["provider"] == DEFAULT), None)
        plain = next((r for r in timed if r["provider"] == DEFAULT_NO_VALIDATE), None)
        explicit = [r for r in timed if r.get("explicit")]
        rematched = [r for r in explicit if "ms_rematch" in r]
        best = min(rematched or explicit, key=_speed_ms) if explicit else None
        flags = "".join(f" [{n} {s}]" for s in ("wrong", "failed", "not_run")
                        if (n := sum(r["status"] == s for r in group)))
        lines.append(
            f"{shape[:58]:<58} {_fmt(default and default['ms'], '10.4f')} "
            f"{_fmt(default and default.get('pct_roof'), '6.1f')} "
            f"{_fmt(plain and _speed_ms(plain), '9.4f')} {_fmt(best and _speed_ms(best), '9.4f')} "
            f"{_fmt(best and best.get('pct_roof'), '6.1f')} "
            f"{_fmt(best and best.get('speedup_vs_default'), '7.3f')}  "
            f"{best['config'] if best else '-'} ({(plain or default or {}).get('config', '-')})"
            f"{flags}")
    return lines


def main(argv=None) -> Path | None:
    start = time.monotonic()
    parser = argparse.ArgumentParser(prog="python -m experiments.sweep_configs",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", choices=sorted(CELL_SETS), default="weak")
    parser.add_argument("--out", default="results/sweep_configs")
    parser.add_argument("--budget", type=float, default=240.0,
                        help="seconds for the whole run; calls past it are recorded as not_run")
    parser.add_argument("--cell-cap", type=float, default=CELL_CAP_S,
                        help="seconds one cell may take")
    parser.add_argument("--compile-workers", type=int, default=None,
                        help="processes that compile first (default: 12 on a GPU, 0 on the CPU)")
    parser.add_argument("--max-configs", type=int, default=None,
                        help="at most this many candidates per cell (the first ones)")
    parser.add_argument("--device", default="cuda",
                        help="cuda; cpu runs the kernels under TRITON_INTERPRET=1 with wall-clock "
                             "timing and no ceilings (for tests)")
    parser.add_argument("--max-docs", type=int, default=bg.MAX_DOCS)
    parser.add_argument("--max-doc-bytes", type=int, default=bg.MAX_DOC_BYTES)
    parser.add_argument("--dry-run", action="store_true", help="list the cells and calls and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sizing = bg.Sizing(args.max_docs, args.max_doc_bytes)
    cells = select_cells(args.cells, sizing)
    if args.dry_run:
        for cell in cells:
            calls = plan(cell, args.max_configs)
            print(f"{cell.name:<58} {cell.estimated_doc_bytes() / 1e6:9.1f} MB  {len(calls)} calls")
            for provider, _, _ in calls:
                print(f"    {provider}")
        return None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("the sweep times GPU kernels and needs a CUDA device "
                             "(or --device cpu)")
        time_fn = bg.gpu_ms
        workers = 12 if args.compile_workers is None else args.compile_workers
        ceilings = None  # measured once the compile workers are done
    else:
        time_fn = lambda fn: bg.wall_clock_ms(fn, reps=1)  # noqa: E731 (interpreter: slow)
        workers = args.compile_workers or 0
        ceilings = {}
    meta = {"cells": args.cells, "sizing": dataclasses.asdict(sizing), "device": args.device,
            "max_configs": args.max_configs}
    path = run(cells, args.out, ceilings=ceilings, budget_s=args.budget,
               cell_cap_s=args.cell_cap, compile_workers=workers, max_configs=args.max_configs,
               device=args.device, time_fn=time_fn, start=start, meta=meta)
    log.info("wrote %s", path)
    doc = json.loads(Path(path).read_text())
    prov = doc["provenance"]
    print()
    print(harness.provenance_line(prov, doc["ceilings"]))
    for line in summary(doc):
        print(line)
    return path


def exit_status(path: Path | None) -> int:
    """1 when any call was wrong (a kernel bug, never a speed result), else 0."""
    if path is None:
        return 0
    rows = json.loads(Path(path).read_text())["rows"]
    return int(any(r["status"] == "wrong" for r in rows))


if __name__ == "__main__":
    sys.exit(exit_status(main()))
