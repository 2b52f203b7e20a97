"""Shape-grid benchmark: our public dense ops and the public peers over the shapes users bring.

    python -m experiments.bench_grid [--out DIR] [--budget SECONDS] [--cells quick|full]
                                     [--providers tilemaxsim,flash_maxsim,...] [--dry-run]
                                     [--groups grid_Lq_d,...] [--skip-done EARLIER.json ...]
                                     [--rounds 3]
    python -m experiments.bench_grid --summary RESULT.json [MORE.json ...]

A cell is one problem: B queries of Lq tokens sharing N documents of dimension d, in fp16 or
bf16, packed (PLAID's layout, lengths drawn from a distribution) or padded (every document Ld
tokens: the peers' padded entry points take no document lengths, so a padded cell with lengths
could not be compared). The cells are not the cartesian product of the axes: they are one-axis
sweeps around the headline shape (B=1, Lq=32, d=128, fp16, packed, log-normal mean 70, 100k
documents) and a coarse 2-D grid per heatmap (Lq x d, B x Lq, distribution x d); ``--cells
quick`` is a subset of ``full`` on coarser axes. Every cell holds 100k documents, fewer where
they would pass MAX_DOC_BYTES, so they are far beyond L2 and one call takes milliseconds; the
read-ceiling target applies to cells with at least TARGET_DOC_BYTES of documents.

Ours is timed as a user calls it: ``maxsim_packed`` / ``maxsim_padded`` with their default
arguments (``validate=True``, ``config=None``). The peers are bench.py's providers. Per cell,
every provider's output is first checked against the float64 reference on a subset of
documents (the first ones and the longest); a wrong or failing provider is recorded, not timed.
The providers that pass are then timed in ``--rounds`` alternated rounds (ROUNDS, 3, by
default), each starting one provider further on, so none is always timed first. The first
one-query cell of each document size on a GPU also times, in the same rounds, a read of as many
bytes as it must read (SAME_SIZE_READ): the rows of every one-query cell of that size carry
``size_read_ms``, ``size_read_bytes`` and ``size_read_pct``, the part of the read ceiling (a
4 GiB read's) that one read of the cell's size reaches.
Cells run in priority order until the time budget is spent; the cells and providers left are
recorded as ``not_run``. Rows (long format, one per cell and provider, with a ``status``) are
written after every cell with harness.write_results; plots are drawn from that file by
``experiments/plots_grid.py``. A grid too long for one device call is split with ``--groups``
and ``--skip-done`` (result files or folders of them, at the same commit; the later part's
``meta.continues`` lists the dates of the parts it continues); plots and ``--summary`` merge the
files.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from . import bench, harness
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.dense import maxsim_packed, maxsim_padded

log = logging.getLogger(__name__)

SUITE = "dense_grid"
RESULT_NAME = "grid"
OURS = bench.OURS
PEERS = ("flash_maxsim", "late_interaction_kernels")
PEER_MODULES = {"flash_maxsim": "flash_maxsim",
                "late_interaction_kernels": "late_interaction_kernels"}
DEFAULT_PROVIDERS = (OURS, *PEERS)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# Sizing: the headline's 100k documents, fewer where the documents would pass 2 GiB (so one call
# stays at a few ms); the read-ceiling target applies to cells with >= 10 MB of documents.
MAX_DOCS = 100_000
MAX_DOC_BYTES = 2 << 30
TARGET_DOC_BYTES = 10_000_000
# Reference check: up to CHECK_DOCS documents (the first ones plus the longest), fewer when the
# float64 similarity block B x docs x Lq x Ld would pass CHECK_ELEMENTS (1 GiB of float64).
CHECK_DOCS = 512
CHECK_ELEMENTS = 1 << 27
# do_bench's warmup and measurement windows: every cell is 0.1-10 ms, so 30 ms of repetitions
# gives 3-300 samples for a round's median while ~700 provider timings of ROUNDS rounds each fit
# in the budget.
TIMING = {"warmup_ms": 10, "rep_ms": 30}
# A cell's providers are timed in ROUNDS alternated rounds, each round starting one provider
# further on (harness.round_order), and a row's ms is the median of its rounds' medians. Timed
# once each in a fixed order, the provider timed first in the cell after the B = 32 cells came
# out well above its own time in every full grid (results/grid/h100-719f57b-full, d = 64
# lognormal-30, against results/dense_variants/h100-719f57b-retime).
ROUNDS = 3
# Timed beside the providers of the first one-query cell of each document size on a GPU: torch's
# sum over as many bytes as the cell must read. The read ceiling is a 4 GiB read's; a read of a
# cell's size pays the same launch, ramp and tail in a shorter time, and this is what one kernel
# reaches at that size.
SAME_SIZE_READ = "same-size read"
# Wall time per cell for the budget's look-ahead and --dry-run: inputs, reference check and the
# timing windows of one provider. Compiles come on top (seconds per new kernel specialisation).
CELL_SETUP_S = 0.4
PROVIDER_S = 0.3

HEADLINE = {"B": 1, "Lq": 32, "d": 128, "dtype": "fp16", "layout": "packed", "dist": "lognormal-70"}
PADDED_DIST = "fixed-128"  # the padded layout's shape in the B sweeps and the padded B x Lq grid


# ---- document length distributions: name -> sampler(n, generator) -> int64 lengths >= 1 ----

def _lognormal(mean: float, sigma: float, cap: int):
    mu = math.log(mean) - sigma**2 / 2  # so that the (unclipped) mean is ``mean``

    def sample(n: int, g: torch.Generator) -> torch.Tensor:
        normal = torch.randn(n, generator=g, dtype=torch.float64)
        return torch.exp(mu + sigma * normal).round().clamp(1, cap).to(torch.int64)

    return sample


def _uniform(low: int, high: int):
    def sample(n: int, g: torch.Generator) -> torch.Tensor:
        return torch.randint(low, high + 1, (n,), generator=g, dtype=torch.int64)

    return sample


# Log-normals with MS MARCO's spread (sigma 0.35, bench.py's) at three means; uniform 1-300; a
# heavy tail (sigma 1.0: ~1 % of documents at the 512-token cap) for corpora of long passages.
DISTRIBUTIONS = {
    "lognormal-30": _lognormal(30, 0.35, 512),
    "lognormal-70": _lognormal(70, 0.35, 512),
    "lognormal-150": _lognormal(150, 0.35, 512),
    "uniform-1-300": _uniform(1, 300),
    "heavy-512": _lognormal(70, 1.0, 512),
}


def padded_length(dist: str) -> int:
    """Ld of a padded cell's ``fixed-<Ld>`` distribution (every document Ld tokens)."""
    if not dist.startswith("fixed-"):
        raise ValueError(f"dist {dist!r}: a padded cell's distribution is 'fixed-<Ld>'")
    return int(dist[len("fixed-"):])


def sample_lengths(dist: str, n: int, seed: int = 0) -> torch.Tensor:
    if dist.startswith("fixed-"):
        return torch.full((n,), padded_length(dist), dtype=torch.int64)
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist {dist!r} is not one of {sorted(DISTRIBUTIONS)} or 'fixed-<Ld>'")
    return DISTRIBUTIONS[dist](n, torch.Generator().manual_seed(seed))


_MEAN_CACHE: dict[str, float] = {}


def mean_length(dist: str) -> float:
    """Mean tokens per document (of a fixed 20k sample: what sizing a cell needs)."""
    if dist not in _MEAN_CACHE:
        _MEAN_CACHE[dist] = float(sample_lengths(dist, 20_000, seed=1).double().mean())
    return _MEAN_CACHE[dist]


# ---- cells ----

@dataclasses.dataclass(frozen=True)
class Sizing:
    max_docs: int = MAX_DOCS
    max_doc_bytes: int = MAX_DOC_BYTES


@dataclasses.dataclass(frozen=True)
class Cell:
    B: int
    Lq: int
    d: int
    dtype: str
    layout: str
    dist: str
    N: int
    groups: tuple[str, ...] = ()

    @property
    def key(self) -> tuple:
        return (self.B, self.Lq, self.d, self.dtype, self.layout, self.dist)

    @property
    def name(self) -> str:
        return (f"B={self.B} Lq={self.Lq} d={self.d} {self.dtype} {self.layout} {self.dist} "
                f"N={self.N}")

    @property
    def packed(self) -> bool:
        return self.layout == "packed"

    def estimated_doc_bytes(self) -> float:
        return self.N * mean_length(self.dist) * self.d * DTYPES[self.dtype].itemsize


def num_docs(dist: str, d: int, dtype: str, sizing: Sizing) -> int:
    per_doc = mean_length(dist) * d * DTYPES[dtype].itemsize
    return max(1, min(sizing.max_docs, int(sizing.max_doc_bytes // per_doc)))


# Axis samples. Query lengths: every power of two and its neighbours (the tiles' edges), the
# ColBERT default 32 and a few in between; d: multiples of 16 from 64 to 768, dense where models
# live (96-384) and at the edges of the kernels' d tiles (64, 128, 256).
AXES = {
    "full": {
        "sweep_Lq": (1, 2, 3, 5, 8, 12, 16, 17, 24, 31, 32, 33, 40, 48, 63, 64),
        "sweep_d": (64, 80, 96, 112, 128, 144, 160, 192, 256, 320, 384, 512, 640, 768),
        "sweep_B": (1, 4, 16, 32),
        "sweep_padded_Ld": (32, 64, 128, 180, 300, 512),
        "sweep_d_padded": (64, 96, 144, 160, 256, 320, 384, 768),
        "sweep_bf16_Lq": (1, 17, 31, 33, 64),
        "sweep_bf16_d": (96, 144, 384, 768),
        "grid_Lq": (1, 8, 16, 24, 31, 32, 33, 48, 64),
        "grid_d": (64, 96, 128, 144, 192, 256, 384, 512, 768),
        "grid_B": (1, 4, 16, 32),
        "grid_B_Lq": (1, 8, 16, 31, 32, 33, 48, 64),
    },
    "quick": {
        "sweep_Lq": (1, 8, 17, 31, 32, 33, 64),
        "sweep_d": (64, 96, 128, 144, 384, 768),
        "sweep_B": (1, 4, 32),
        "sweep_padded_Ld": (64, 128, 512),
        "sweep_d_padded": (144,),
        "sweep_bf16_Lq": (33,),
        "sweep_bf16_d": (384,),
        "grid_Lq": (1, 16, 33, 64),
        "grid_d": (96, 128, 384),
        "grid_B": (1, 4, 32),
        "grid_B_Lq": (1, 32, 64),
    },
}


def grid_specs(mode: str) -> dict:
    """The 2-D grids (heatmaps): axes, values and the fixed coordinates, as the plots need them."""
    a = AXES[mode]
    dists = tuple(DISTRIBUTIONS)
    packed_1q = {k: HEADLINE[k] for k in ("B", "dtype", "layout", "dist")}
    return {
        "grid_Lq_d": {"x": "d", "x_values": a["grid_d"], "y": "Lq", "y_values": a["grid_Lq"],
                      "fixed": packed_1q},
        "grid_B_Lq": {"x": "Lq", "x_values": a["grid_B_Lq"], "y": "B", "y_values": a["grid_B"],
                      "fixed": {**HEADLINE, "B": None, "Lq": None}},
        "grid_dist_d": {"x": "d", "x_values": a["grid_d"], "y": "dist", "y_values": dists,
                        "fixed": {**HEADLINE, "d": None, "dist": None}},
        "grid_B_Lq_padded": {"x": "Lq", "x_values": a["grid_B_Lq"], "y": "B",
                             "y_values": a["grid_B"],
                             "fixed": {**HEADLINE, "B": None, "Lq": None, "layout": "padded",
                                       "dist": PADDED_DIST}},
    }


def _ordered_2d(xs, ys):
    """A grid's coordinates, every other row and column first: a cut leaves a coarse heatmap."""
    coords = [(i, j) for i in range(len(ys)) for j in range(len(xs))]
    coords.sort(key=lambda ij: (ij[0] % 2, ij[1] % 2, ij))
    return [(ys[i], xs[j]) for i, j in coords]


def build_cells(mode: str = "full", sizing: Sizing = Sizing(),
                groups: list[str] | None = None) -> list[Cell]:
    """Cells in priority order (headline, one-axis sweeps, then the grids), each once, with the
    names of every sweep and grid it belongs to; only those in ``groups`` when given (a run
    split over several device calls)."""
    if mode not in AXES:
        raise ValueError(f"cells must be one of {sorted(AXES)}, got {mode!r}")
    a = AXES[mode]
    wanted: list[tuple[str, dict]] = [("headline", {})]
    wanted += [("sweep_Lq", {"Lq": v}) for v in a["sweep_Lq"]]
    wanted += [("sweep_d", {"d": v}) for v in a["sweep_d"]]
    wanted += [("sweep_B", {"B": v}) for v in a["sweep_B"]]
    wanted += [("sweep_B_padded", {"B": v, "layout": "padded", "dist": PADDED_DIST})
               for v in a["sweep_B"]]
    wanted += [("sweep_d_padded", {"d": v, "layout": "padded", "dist": PADDED_DIST})
               for v in a["sweep_d_padded"]]
    wanted += [("sweep_dist", {"dist": v}) for v in DISTRIBUTIONS]
    wanted += [("sweep_padded", {"layout": "padded", "dist": f"fixed-{v}"})
               for v in a["sweep_padded_Ld"]]
    wanted += [("sweep_dtype", {"dtype": t, "layout": lay, "dist": dist})
               for t in DTYPES
               for lay, dist in (("packed", HEADLINE["dist"]), ("padded", PADDED_DIST))]
    wanted += [("sweep_bf16", {"dtype": "bf16", "Lq": v}) for v in a["sweep_bf16_Lq"]]
    wanted += [("sweep_bf16", {"dtype": "bf16", "d": v}) for v in a["sweep_bf16_d"]]
    for name, spec in grid_specs(mode).items():
        fixed = {k: v for k, v in spec["fixed"].items() if v is not None}
        for y, x in _ordered_2d(spec["x_values"], spec["y_values"]):
            wanted.append((name, {**fixed, spec["y"]: y, spec["x"]: x}))

    cells: dict[tuple, Cell] = {}
    for group, change in wanted:
        p = {**HEADLINE, **change}
        n = num_docs(p["dist"], p["d"], p["dtype"], sizing)
        cell = Cell(p["B"], p["Lq"], p["d"], p["dtype"], p["layout"], p["dist"], n)
        if cell.key in cells:
            old = cells[cell.key]
            if group not in old.groups:
                cells[cell.key] = dataclasses.replace(old, groups=old.groups + (group,))
        else:
            cells[cell.key] = dataclasses.replace(cell, groups=(group,))
    if groups is None:
        return list(cells.values())
    known = {group for group, _ in wanted}
    unknown = sorted(set(groups) - known)
    if unknown:
        raise ValueError(f"groups {unknown} are not among {sorted(known)}")
    return [c for c in cells.values() if set(c.groups) & set(groups)]


def estimated_seconds(cell: Cell, num_providers: int) -> float:
    return CELL_SETUP_S + PROVIDER_S * num_providers


# ---- inputs, providers, check ----

def make_inputs(cell: Cell, device, seed: int = 0) -> bench.Inputs:
    """Unit-norm query rows as ColBERT produces them; documents N(0, 1/d) (never zeros, which
    would hide unwritten outputs)."""
    dtype = DTYPES[cell.dtype]
    g = torch.Generator(device=device).manual_seed(seed)
    Q = torch.randn(cell.B, cell.Lq, cell.d, device=device, generator=g)
    Q = torch.nn.functional.normalize(Q, dim=-1).to(dtype)
    lengths = sample_lengths(cell.dist, cell.N, seed=seed)
    scale = 1 / math.sqrt(cell.d)
    if not cell.packed:
        D = torch.randn(cell.N, padded_length(cell.dist), cell.d, device=device, dtype=dtype,
                        generator=g).mul_(scale)
        return bench.Inputs(Q=Q, D=D, lengths=lengths.to(device))
    offsets = torch.zeros(cell.N + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    D_packed = torch.randn(int(offsets[-1]), cell.d, device=device, dtype=dtype,
                           generator=g).mul_(scale)
    return bench.Inputs(Q=Q, D_packed=D_packed, offsets=offsets.to(device),
                        lengths=lengths.to(device))


def bench_case(cell: Cell, x: bench.Inputs) -> bench.Case:
    """bench.py's description of the cell, which its peer providers take."""
    max_len = int(x.lengths.max()) if x.lengths.numel() else 0
    return bench.Case(cell.name, cell.B, cell.Lq, cell.N, max_len, cell.d, packed=cell.packed,
                      sweep=SUITE)


def provider_ours(cell: Cell, x: bench.Inputs, **kwargs):
    """The public op with its default arguments (what a user who calls it gets), or with
    ``kwargs`` (``validate=False``, say)."""
    Q = x.Q[0] if cell.B == 1 else x.Q
    if cell.packed:
        return lambda: maxsim_packed(Q, x.D_packed, x.offsets, **kwargs)
    return lambda: maxsim_padded(Q, x.D, **kwargs)


def _bench_provider(name: str):
    def make(cell: Cell, x: bench.Inputs):
        return bench.PROVIDERS[name](bench_case(cell, x), x)

    return make


def known_providers() -> dict:
    """Ours (the public default call) and bench.py's other providers (the peers among them)."""
    out = {OURS: provider_ours}
    out.update({name: _bench_provider(name) for name in bench.PROVIDERS if name != OURS})
    return out


def check_subset(cell: Cell, x: bench.Inputs) -> torch.Tensor:
    """Document ids to check: the first ones and the longest, as many as CHECK_ELEMENTS allows."""
    max_len = int(x.lengths.max()) if x.lengths.numel() else 1
    k = min(cell.N, CHECK_DOCS, max(2, CHECK_ELEMENTS // max(1, cell.B * cell.Lq * max_len)))
    longest = int(torch.argmax(x.lengths.cpu()))
    ids = list(range(k - 1)) + ([longest] if longest >= k - 1 else [k - 1])
    return torch.tensor(ids, dtype=torch.int64)


def reference_scores(cell: Cell, x: bench.Inputs, ids: torch.Tensor) -> torch.Tensor:
    """float64 reference scores [B, len(ids)] (computed where the inputs are)."""
    if cell.packed:
        return reference.maxsim_packed(x.Q, x.D_packed, x.offsets, ids.to(x.Q.device)).cpu()
    return reference.maxsim_padded(x.Q, x.D[ids.to(x.D.device)]).cpu()


def wall_clock_ms(fn, reps: int = 3) -> tuple[float, float, float]:
    """Median, min and max wall time of ``fn`` in ms: the timer of a CPU (interpreter) run."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times), max(times)


def gpu_ms(fn) -> tuple[float, float, float]:
    return harness.time_ms(fn, **TIMING)


# ---- rows ----

ROW_KEYS = ("suite", "shape", "provider", "status", "ms", "ms_p20", "ms_p80", "docs_per_s",
            "bytes", "gbps", "pct_read_bw", "tflops", "pct_bf16_peak")


def cell_fields(cell: Cell, x: bench.Inputs | None) -> dict:
    """The fields every row of a cell carries (its shape, and its sizes once ``x`` is built)."""
    fields = {"B": cell.B, "Lq": cell.Lq, "d": cell.d, "dtype": cell.dtype,
              "layout": cell.layout, "dist": cell.dist, "N": cell.N,
              "groups": ";".join(cell.groups)}
    if x is not None:
        t = x.D_packed if cell.packed else x.D
        fields.update(tokens=int(x.lengths.sum()), Ld=int(x.lengths.max()),
                      doc_bytes=t.numel() * t.element_size())
    else:
        fields.update(tokens=None, Ld=None, doc_bytes=int(cell.estimated_doc_bytes()))
    fields["at_least_10mb"] = fields["doc_bytes"] >= TARGET_DOC_BYTES
    return fields


def status_row(cell: Cell, provider: str, status: str, x: bench.Inputs | None = None,
               reason: str = "", **extra) -> dict:
    """A row for a provider that was not timed on a cell (absent, unsupported, wrong, failed,
    not_run): same keys as a timed row, no measurements."""
    row = dict.fromkeys(ROW_KEYS)
    row.update(suite=SUITE, shape=cell.name, provider=provider, status=status)
    row.update(cell_fields(cell, x), reason=reason, **extra)
    return row


def bytes_and_flops(cell: Cell, x: bench.Inputs) -> tuple[int, float]:
    """Document bytes once plus the queries; 2 * B * Lq * tokens * d multiply-adds (the padded
    layout's every token is a real one)."""
    q_bytes = x.Q.numel() * x.Q.element_size()
    t = x.D_packed if cell.packed else x.D
    tokens = t.numel() // cell.d
    return t.numel() * t.element_size() + q_bytes, 2.0 * cell.B * cell.Lq * tokens * cell.d


def _failed(cell: Cell, provider: str, x: bench.Inputs, exc: Exception) -> dict:
    log.warning("  %s failed: %s: %s", provider, type(exc).__name__, str(exc)[:200])
    return status_row(cell, provider, "failed", x,
                      reason=f"{type(exc).__name__}: {str(exc)[:200]}")


def run_cell(cell: Cell, providers: dict, ceilings: dict, *, device, time_fn, clock,
             deadline: float, rounds: int = ROUNDS, size_reads: dict | None = None) -> list[dict]:
    """Check, then time, every provider on ``cell``: its rows. ``size_reads``: the same-size
    reads timed so far in the run, by document bytes (one is timed per size, in the rounds of
    the first one-query cell of that size, and given to the rows of every cell of it)."""
    x = make_inputs(cell, device)
    nbytes, flops = bytes_and_flops(cell, x)
    log.info("[%s] groups=%s doc bytes %.1f MB", cell.name, ",".join(cell.groups),
             cell_fields(cell, x)["doc_bytes"] / 1e6)
    ids = check_subset(cell, x)
    ref = reference_scores(cell, x, ids)
    case = bench_case(cell, x)
    rows, calls = [], {}
    size_reads = {} if size_reads is None else size_reads
    doc_bytes = cell_fields(cell, x)["doc_bytes"]
    reads = times_size_read(cell, x)
    if reads and doc_bytes not in size_reads:
        calls[SAME_SIZE_READ] = (same_size_read(nbytes, x.Q.device), None, None)
    for name, make in providers.items():
        if clock() > deadline:
            rows.append(status_row(cell, name, "not_run", x, reason="time budget spent"))
            continue
        module = PEER_MODULES.get(name)
        if module and importlib.util.find_spec(module) is None:
            rows.append(status_row(cell, name, "absent", x, reason=f"{module} is not installed"))
            continue
        try:
            fn = make(cell, x)
            if fn is None:
                rows.append(status_row(cell, name, "unsupported", x,
                                       reason=f"{name} has no entry point for this layout and B"))
                continue
            first = time.perf_counter()
            got = fn().reshape(cell.B, -1)[:, ids.to(x.Q.device)]
            err = bench.check_output(name, case, got, ref)
            # The first call's wall time holds the compiles (and a peer's autotuning): where a
            # run's budget goes, which the timed median does not show.
            first_call_s = time.perf_counter() - first
        except Exception as exc:  # a peer that cannot take a shape is recorded, not fatal
            rows.append(_failed(cell, name, x, exc))
            continue
        if math.isnan(err):
            log.warning("  %s WRONG on %s: not timed", name, cell.name)
            rows.append(status_row(cell, name, "wrong", x, reason="differs from the float64 "
                                   f"reference on {len(ids)} documents", max_rel_err=err,
                                   first_call_s=first_call_s))
            continue
        calls[name] = (fn, err, first_call_s)
    timed: dict[str, list] = {name: [] for name in calls}
    for r in range(rounds):
        for name in harness.round_order(list(timed), r):
            if name not in timed:
                continue  # failed in an earlier round
            try:
                timed[name].append(time_fn(calls[name][0]))
            except Exception as exc:
                if name == SAME_SIZE_READ:  # not a provider: no row, the cells go without it
                    log.warning("  %s failed: %s: %s", name, type(exc).__name__, str(exc)[:200])
                else:
                    rows.append(_failed(cell, name, x, exc))
                del timed[name]
    if SAME_SIZE_READ in timed:
        size_reads[doc_bytes] = _size_read_fields(timed.pop(SAME_SIZE_READ), nbytes, ceilings)
    size_read = size_reads.get(doc_bytes, {}) if reads else {}
    for name, samples in timed.items():
        _, err, first_call_s = calls[name]
        timing = tuple(statistics.median(t[i] for t in samples) for i in range(3))
        row = harness.make_row(SUITE, cell.name, name, timing, num_docs=cell.B * cell.N,
                               nbytes=nbytes, flops=flops, ceilings=ceilings, status="ok",
                               **cell_fields(cell, x), max_rel_err=err, checked_docs=len(ids),
                               first_call_s=first_call_s, round_ms=[t[0] for t in samples],
                               **size_read)
        log.info("  %-26s %9.4f ms  %s %% read BW  (first call %.1f s)", name, row["ms"],
                 "-" if row["pct_read_bw"] is None else f"{row['pct_read_bw']:.1f}", first_call_s)
        rows.append(row)
    order = list(providers)
    rows.sort(key=lambda row: order.index(row["provider"]))
    annotate(rows, ceilings)
    del x, calls  # the same-size read's buffer too
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def times_size_read(cell: Cell, x: bench.Inputs) -> bool:
    """Whether a cell's rounds time :data:`SAME_SIZE_READ`: one query, on a GPU (the read ceiling
    it is set against is a GPU's)."""
    return cell.B == 1 and x.Q.is_cuda


def same_size_read(nbytes: int, device) -> Callable[[], torch.Tensor]:
    """A callable that reads ``nbytes`` (fp16, uninitialized: the values do not change the time)
    once, as torch's sum does: :data:`SAME_SIZE_READ`."""
    x = torch.empty(max(1, nbytes // 2), dtype=torch.float16, device=device)
    return lambda: x.sum(dtype=torch.float32)


def _size_read_fields(samples, nbytes: int, ceilings: dict) -> dict:
    """A read of ``nbytes`` timed in ``samples`` (rounds), as rows carry it: ``size_read_ms``
    (the median of the rounds), ``size_read_bytes`` and ``size_read_pct`` (% of the read
    ceiling it reaches)."""
    ms = statistics.median(t[0] for t in samples)
    read = ceilings.get("read_gbps")
    return {"size_read_ms": ms, "size_read_bytes": nbytes,
            "size_read_pct": 100.0 * nbytes / ms / 1e6 / read if read else None}


def annotate(rows: list[dict], ceilings: dict) -> None:
    """Per cell: which ceiling bounds it (bytes at the read ceiling or products at the bf16
    ceiling, whichever takes longer), % of that roof, and ours / best peer (>1: ours faster)."""
    by_cell: dict[str, list[dict]] = {}
    for row in rows:
        by_cell.setdefault(row["shape"], []).append(row)
    for group in by_cell.values():
        timed = [r for r in group if r["status"] == "ok"]
        peers = [r for r in timed if r["provider"] in PEERS]
        best = min(peers, key=lambda r: r["ms"]) if peers else None
        for row in timed:
            read, mm = ceilings.get("read_gbps"), ceilings.get("bf16_tflops")
            if read and mm:
                read_ms = row["bytes"] / read / 1e6
                mm_ms = row["tflops"] * row["ms"] / mm  # flops / peak, in ms
                row["bound"] = "read" if read_ms >= mm_ms else "bf16_tensor"
                row["pct_roof"] = 100.0 * max(read_ms, mm_ms) / row["ms"]
            else:
                row["bound"] = row["pct_roof"] = None
            row["best_peer"] = best["provider"] if best else None
            row["ratio_to_best_peer"] = best["ms"] / row["ms"] if best else None


# ---- the run ----

def run(cells: list[Cell], providers: dict, out, *, ceilings: dict, budget_s: float,
        device="cuda", time_fn=gpu_ms, clock=time.monotonic, start: float | None = None,
        meta: dict | None = None, rounds: int = ROUNDS) -> Path:
    """Run ``cells`` in order until ``budget_s`` (from ``start``) is spent; write the rows
    (every cell and provider, run or not) after each cell. Returns the JSON's path."""
    start = clock() if start is None else start
    deadline = start + budget_s
    meta = dict(meta or {})
    meta.update(budget_s=budget_s, providers=list(providers), planned_cells=len(cells),
                target_doc_bytes=TARGET_DOC_BYTES, timing=TIMING, rounds=rounds)
    rows: list[dict] = []
    not_run: list[str] = []
    size_reads: dict = {}  # run_cell's same-size reads, by document bytes
    took: list[float] = []  # wall seconds of each cell run so far
    for i, cell in enumerate(cells):
        # Look ahead by the larger of the fixed estimate and the recent cells' median: the
        # compiles and the peers' autotuning make real cells longer than their timing windows.
        ahead = max([estimated_seconds(cell, len(providers))] +
                    ([statistics.median(took[-5:])] if took else []))
        began = clock()
        if began + ahead > deadline:
            not_run = [c.name for c in cells[i:]]
            log.warning("time budget of %.0f s spent: %d of %d cells not run (recorded)",
                        budget_s, len(not_run), len(cells))
            for rest in cells[i:]:
                rows += [status_row(rest, name, "not_run", reason="time budget spent")
                         for name in providers]
            break
        rows += run_cell(cell, providers, ceilings, device=device, time_fn=time_fn, clock=clock,
                         deadline=deadline, rounds=rounds, size_reads=size_reads)
        took.append(clock() - began)
        # Written after every cell, with the cells still to run as not_run rows, so a run
        # killed at its wall-clock limit keeps what it measured and its file (and a later
        # part's --skip-done, and the targets read off it) names every cell it did not run.
        meta.update(cells_run=i + 1, not_run=[c.name for c in cells[i + 1:]],
                    elapsed_s=clock() - start)
        pending = [status_row(rest, name, "not_run", reason="not reached: the run stopped")
                   for rest in cells[i + 1:] for name in providers]
        harness.write_results(rows + pending, out, RESULT_NAME, ceilings=ceilings, meta=meta)
    meta.update(cells_run=len(cells) - len(not_run), not_run=not_run, elapsed_s=clock() - start)
    return harness.write_results(rows, out, RESULT_NAME, ceilings=ceilings, meta=meta)


def done_parts(paths, commit: str) -> dict[Path, str]:
    """The result files ``--skip-done`` names (files, or folders: every grid.json under one),
    each with its provenance date. A split run is one commit's: a part measured at another
    commit, or a path that holds no result file, is refused naming it."""
    parts = {}
    for path in map(Path, paths):
        found = sorted(path.rglob("grid.json")) if path.is_dir() else [path] * path.is_file()
        if not found:
            raise SystemExit(f"--skip-done {path}: no grid result file there")
        for part in found:
            prov = json.loads(part.read_text()).get("provenance", {})
            if prov.get("commit") != commit:
                raise SystemExit(f"--skip-done {part}: measured at commit {prov.get('commit')}, "
                                 f"this run is at {commit}; a split run is one commit's")
            parts[part] = prov.get("date", "")
    return parts


def summary(doc: dict) -> list[str]:
    """The lines printed last: coverage, the targets' counts and the worst cells."""
    rows = doc["rows"]
    ours = [r for r in rows if r["provider"] == OURS and r["status"] == "ok"]
    cells = {r["shape"] for r in rows}
    ran = {r["shape"] for r in rows if r["status"] != "not_run"}
    lines = [f"cells: {len(ran)} of {len(cells)} run; {len(cells) - len(ran)} not run (budget)"]
    statuses: dict[tuple, int] = {}
    for r in rows:
        statuses[(r["provider"], r["status"])] = statuses.get((r["provider"], r["status"]), 0) + 1
    lines.append("rows by provider and status: " + ", ".join(
        f"{p}:{s}={n}" for (p, s), n in sorted(statuses.items())))
    big = [r for r in ours if r.get("at_least_10mb")]

    def count(subset, key, limit):
        have = [r for r in subset if r.get(key) is not None]
        return f"{sum(r[key] >= limit for r in have)}/{len(have)}"

    packed_1q = [r for r in big if r["layout"] == "packed" and r["B"] == 1]
    multi = [r for r in big if r["B"] >= 4]
    lines.append(f"packed B=1 cells >= 10 MB at >= 90 % of the read ceiling: "
                 f"{count(packed_1q, 'pct_read_bw', 90.0)}")
    for r in sorted((r for r in packed_1q if r.get("pct_read_bw") is not None
                     and r["pct_read_bw"] < 90.0 and r.get("size_read_pct") is not None),
                    key=lambda r: r["pct_read_bw"]):
        lines.append(f"  {r['pct_read_bw']:5.1f} % {r['shape']}: a {SAME_SIZE_READ} of its "
                     f"{r['size_read_bytes'] / 1e6:.0f} MB {r['size_read_pct']:.1f} %")
    lines.append(f"all cells >= 10 MB at >= 90 % of the read ceiling: "
                 f"{count(big, 'pct_read_bw', 90.0)}")
    lines.append(f"B >= 4 cells >= 10 MB at >= 70 % of their roof (read or bf16 tensor): "
                 f"{count(multi, 'pct_roof', 70.0)}")
    lines.append(f"cells >= 10 MB at >= 1.0x the best peer (of those with a peer timed): "
                 f"{count(big, 'ratio_to_best_peer', 1.0)}")
    wrong = [r for r in rows if r["status"] in ("wrong", "failed")]
    for r in wrong:
        lines.append(f"  {r['status'].upper()} {r['provider']} on {r['shape']}: {r.get('reason')}")
    for key, label in (("pct_roof", "% of roof"), ("pct_read_bw", "% read BW"),
                       ("ratio_to_best_peer", "x best peer")):
        have = sorted((r for r in ours if r.get(key) is not None), key=lambda r: r[key])[:8]
        if have:
            lines.append(f"worst cells by {label}:")
            lines += [f"  {r[key]:8.2f} {label:<12} {r['shape']} ({r['ms']:.4f} ms, "
                      f"bound {r.get('bound')}, best peer {r.get('best_peer')})" for r in have]
    return lines


def main(argv=None) -> Path | None:
    start = time.monotonic()
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_grid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/grid")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for the whole run; cells past it are recorded as not_run")
    parser.add_argument("--cells", choices=sorted(AXES), default="full")
    parser.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS),
                        help=f"comma-separated, from {sorted(known_providers())}")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="alternated timing rounds per cell (a row's ms: the median of its "
                             "rounds' medians)")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and stop")
    parser.add_argument("--device", default="cuda",
                        help="cuda; cpu runs the kernels under TRITON_INTERPRET=1 with wall-clock "
                             "timing and no ceilings (for tests)")
    parser.add_argument("--max-docs", type=int, default=MAX_DOCS)
    parser.add_argument("--max-doc-bytes", type=int, default=MAX_DOC_BYTES)
    parser.add_argument("--groups", default="",
                        help="comma-separated sweeps/grids to run (default: all), to split a run")
    parser.add_argument("--skip-done", nargs="+", default=[], metavar="RESULT",
                        help="skip the cells that earlier result files (or folders of them) ran")
    parser.add_argument("--summary", nargs="+", default=[], metavar="RESULT",
                        help="print the summary of result files (merged) and stop")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from . import plots_grid

    if args.summary:
        for line in summary(plots_grid.merge_results(args.summary)):
            print(line)
        return None

    known = known_providers()
    names = [p for p in args.providers.split(",") if p]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown providers {unknown}; known: {sorted(known)}")
    providers = {name: known[name] for name in names}
    sizing = Sizing(args.max_docs, args.max_doc_bytes)
    groups = [g for g in args.groups.split(",") if g] or None
    try:
        cells = build_cells(args.cells, sizing, groups)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    continues = []
    if args.skip_done:
        parts = done_parts(args.skip_done, harness.provenance()["commit"])
        done = {r["shape"] for r in plots_grid.merge_results(list(parts))["rows"]
                if r["status"] != "not_run"}
        log.info("skipping %d cells run in %s", sum(c.name in done for c in cells),
                 [str(p) for p in parts])
        cells = [c for c in cells if c.name not in done]
        continues = sorted(set(parts.values()))
    est = sum(estimated_seconds(c, len(providers)) for c in cells)
    log.info("%d cells (%s), ~%.0f s of timing before compiles, budget %.0f s",
             len(cells), args.cells, est, args.budget)
    if args.dry_run:
        for cell in cells:
            print(f"{cell.name:<58} {cell.estimated_doc_bytes() / 1e6:9.1f} MB  "
                  f"{','.join(cell.groups)}")
        return None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("the grid times GPU kernels and needs a CUDA device (or --device cpu)")
        ceilings = harness.measure_ceilings()
        time_fn = gpu_ms
    else:
        ceilings, time_fn = {}, wall_clock_ms
    log.info("ceilings: %s", {k: round(v, 1) for k, v in ceilings.items()})
    meta = {"cells": args.cells, "sizing": dataclasses.asdict(sizing), "device": args.device,
            "grids": grid_specs(args.cells), "headline": HEADLINE, "groups": groups,
            "skip_done": args.skip_done, "continues": continues}
    path = run(cells, providers, args.out, ceilings=ceilings, budget_s=args.budget,
               device=args.device, time_fn=time_fn, start=start, meta=meta, rounds=args.rounds)
    log.info("wrote %s", path)
    if not args.no_plots:
        try:
            for plot in plots_grid.plot_all(path):
                log.info("wrote %s", plot)
        except ImportError as exc:
            log.warning("no plots (%s): draw them with python -m experiments.plots_grid %s",
                        exc, path)
    doc = json.loads(Path(path).read_text())
    timed = [r for r in doc["rows"] if r["status"] == "ok"]
    if timed:
        harness.print_table(timed)
    prov = doc["provenance"]
    print()
    print(harness.provenance_line(prov, ceilings))
    for line in summary(doc):
        print(line)
    return path


if __name__ == "__main__":
    main()
