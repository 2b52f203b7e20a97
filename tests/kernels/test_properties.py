"""Property-based tests over the shape grid's space against the float64 reference.

Each property draws one problem from the axes of experiments/bench_grid.py -- B queries (1, 4,
16, 32) of Lq tokens (1..64) sharing documents of dimension d (multiples of 16 in 64..768), fp16
or bf16 (fp32 too, which the ops take), packed or padded, document lengths from the grid's
distributions with empty documents and empty query rows mixed in, arguments as strided views --
and an explicit launch configuration from the op's config class, or None (the default
heuristic, as it chooses for many documents or for few; for the dense ops, as a card of a
drawn memory bandwidth chooses). A configuration the op must refuse (a malformed field, or a
combination that does not apply to the input) raises a ValueError naming the config; every
other call matches the reference in every element within tests/tolerances.py.

The interpreter is slow, so each example's documents are cut to a token budget that shrinks as
the query side grows (DENSE_WORK, COMPRESSED_WORK): a large query side (B = 32, Lq = 64,
d = 768) sees a few short documents, a small one the grid's full lengths. The compressed ops,
whose programs cost the interpreter several times a dense one's, take at most
COMPRESSED_MAX_ROWS query rows (B * Lq) per example; the explicit edge examples go past it
once. Inputs are finite; tensor data comes from a drawn seed, so a failing example reproduces
from its printed arguments.

Profiles (registered in tests/conftest.py): "ci", the default, is derandomized, so every run
draws the same examples; ``HYPOTHESIS_PROFILE=thorough`` draws THOROUGH_FACTOR times as many,
fresh each run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import ON_GPU, poison, property_examples
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.codecs.residual import SUPPORTED_NBITS, residual_inverse_norms
from tilemaxsim_plaid.ops import dense, nvrtc, pq, pq_lut_shared, pq_mma, residual
from tilemaxsim_plaid.ops.dense import MAX_BLOCK_D as DENSE_MAX_BLOCK_D
from tilemaxsim_plaid.ops.dense import (MAX_HELD_CHUNKS, MIN_DOT_DIM, MaxSimConfig, maxsim_packed,
                                        maxsim_padded)
from tilemaxsim_plaid.ops.pq import LUT_ROWS, SCORING, PQConfig, maxsim_pq, subquantizer_blocking
from tilemaxsim_plaid.ops.residual import (
    DECODERS,
    MAX_MAXNREG,
    MIN_MAXNREG,
    ResidualConfig,
    default_block_d,
    maxsim_residual,
)

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
THOROUGH_FACTOR = 10
# Per example, B * Lq * d * (document tokens) of the dense ops, and (16-row query blocks) *
# (128-column chunks of d) * (document tokens) of the compressed ones: about a second of the
# interpreter at most; the documents past it are dropped and the last one cut (empty ones stay).
DENSE_WORK = 1 << 22
COMPRESSED_WORK = 1 << 11
COMPRESSED_MAX_ROWS = 128


def grid_settings(examples: int):
    """Settings of one property: the profile's, with ``examples`` examples on the CPU (fewer on a
    GPU, where every new combination compiles), THOROUGH_FACTOR times as many when thorough."""
    count = property_examples(examples) * (THOROUGH_FACTOR if PROFILE == "thorough" else 1)
    return settings(settings.get_profile(PROFILE), max_examples=count, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def explicit_examples(problems):
    """Each of ``problems`` run as an explicit example of the property, first, in every profile."""
    def decorate(test):
        for problem in reversed(problems):
            test = example(problem=problem)(test)
        return test
    return decorate


@pytest.fixture(autouse=True)
def _poisoned_outputs(monkeypatch):
    """Every floating tensor an op allocates starts as NaN, so an unwritten element fails."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return poison(t) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


def _pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def _strided(x: torch.Tensor) -> torch.Tensor:
    """The same values as a view in which no dimension has unit stride."""
    return torch.stack([x, torch.zeros_like(x)], -1)[..., 0]


# ---- the grid's axes (experiments/bench_grid.py: AXES, DTYPES, DISTRIBUTIONS) ----

BATCH_SIZES = (1, 4, 16, 32)
MAX_LQ = 64
DIMS = tuple(range(64, 769, 16))
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (mean, sigma, cap) of the grid's log-normal lengths, and the bounds of its uniform one.
LOGNORMALS = {"lognormal-30": (30, 0.35, 512), "lognormal-70": (70, 0.35, 512),
              "lognormal-150": (150, 0.35, 512), "heavy-512": (70, 1.0, 512)}
UNIFORMS = {"uniform-1-300": (1, 300)}
MAX_DOCS = 4


def doc_length(dist: str) -> st.SearchStrategy[int]:
    """One length of ``dist``: a log-normal drawn through its standard normal (so shrinking
    walks toward the median), clipped like the grid's sampler, or a uniform integer."""
    if dist in UNIFORMS:
        return st.integers(*UNIFORMS[dist])
    mean, sigma, cap = LOGNORMALS[dist]
    mu = math.log(mean) - sigma**2 / 2
    return st.floats(-3.5, 3.5).map(
        lambda z: int(min(cap, max(1, round(math.exp(mu + sigma * z))))))


@st.composite
def doc_lengths(draw, max_tokens: int, max_docs: int = MAX_DOCS) -> tuple[str, list[int]]:
    """(distribution, lengths): 1..max_docs documents of one distribution and up to two empty
    ones, cut to max_tokens (at least 1) in all: documents past it dropped, the last one cut."""
    dist = draw(st.sampled_from(sorted(LOGNORMALS) + sorted(UNIFORMS)))
    lengths = draw(st.lists(doc_length(dist), min_size=1, max_size=max_docs))
    for _ in range(draw(st.integers(0, 2))):
        lengths.insert(draw(st.integers(0, len(lengths))), 0)
    budget = max(1, max_tokens)
    cut = []
    for n in lengths:
        if n and not budget:
            continue
        cut.append(min(n, budget))
        budget -= cut[-1]
    return dist, cut


@dataclasses.dataclass(frozen=True)
class QuerySide:
    B: int
    Lq: int
    d: int
    dtype: torch.dtype
    query_lengths: tuple[int, ...] | None  # None: every query has Lq tokens

    def dense_tokens(self) -> int:
        return DENSE_WORK // (self.B * _next_pow2(self.Lq) * self.d)

    def compressed_tokens(self) -> int:
        row_blocks = -(-self.B * _next_pow2(self.Lq) // MIN_DOT_DIM)
        return COMPRESSED_WORK // (row_blocks * -(-self.d // 128))


@st.composite
def query_sides(draw, max_rows: int = BATCH_SIZES[-1] * MAX_LQ) -> QuerySide:
    """B queries of Lq tokens (B * Lq <= max_rows) of one dimension and dtype."""
    B = draw(st.sampled_from(BATCH_SIZES))
    Lq = draw(st.integers(1, min(MAX_LQ, max_rows // B)))
    d = draw(st.sampled_from(DIMS))
    dtype = draw(st.sampled_from(DTYPES))
    lengths = None
    if draw(st.booleans()):  # a length of 0 is an empty query row (it scores 0)
        lengths = tuple(draw(st.lists(st.integers(0, Lq), min_size=B, max_size=B)))
    return QuerySide(B, Lq, d, dtype, lengths)


def _queries(q: QuerySide, g: torch.Generator):
    Q = (torch.randn(q.B, q.Lq, q.d, generator=g, dtype=torch.float64) / math.sqrt(q.d)).to(q.dtype)
    lengths = None if q.query_lengths is None else torch.tensor(q.query_lengths)
    return Q.to(DEVICE), None if lengths is None else lengths.to(DEVICE)


def _offsets(lengths) -> torch.Tensor:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return offsets


@st.composite
def pid_lists(draw, num_docs: int) -> tuple[int, ...] | None:
    """None (every document) or a subset in any order, repeats included."""
    if not draw(st.booleans()):
        return None
    return tuple(draw(st.lists(st.integers(0, num_docs - 1), min_size=1, max_size=num_docs + 2)))


def _maybe_malformed(draw, config, malformed: dict):
    """``config``, or in one draw of four ``config`` with one field set to a value the op must
    refuse."""
    if draw(st.integers(0, 3)) < 3:
        return config
    field = draw(st.sampled_from(sorted(malformed)))
    return dataclasses.replace(config, **{field: draw(st.sampled_from(malformed[field]))})


def _counted_as_many(module, on: bool):
    """``module.MANY_DOCS`` = 1 while ``on``: a default (config None) takes the paths it takes
    for a large collection over the few documents of an example."""
    return mock.patch.object(module, "MANY_DOCS", 1) if on else contextlib.nullcontext()


def _check(call, refusal: str | None, expected, op: str, dtype: torch.dtype):
    """The property every test states: refused with a ValueError naming the config when
    ``refusal`` says why, else equal to the reference within the (op, dtype) tolerance."""
    if refusal is not None:
        with pytest.raises(ValueError, match="config"):
            call()
        return
    try:
        out = call()
    except ValueError as err:
        # Which explicit configs fit in shared memory and registers depends on the GPU (known
        # when Triton compiles): such a one is refused naming it (ops/launch._does_not_fit).
        if ON_GPU and "does not fit this GPU" in str(err):
            return
        raise
    want = expected()
    assert out.shape == want.shape
    assert_close(out, want, op, dtype)


# ---- dense: maxsim_packed / maxsim_padded and MaxSimConfig ----

DENSE_KINDS = ("plain", "single_tile", "slots", "hold_query")
# Values no launch takes: _check_config refuses them.
DENSE_MALFORMED = {"block_t": (0, 3, 24), "queries_per_block": (0, 3, 6),
                   "q_blocks_per_program": (0, -1), "docs_per_program": (0, -2),
                   "block_d": (8, 48, 256)}
DENSE_BLOCK_DS = (16, 32, 64, DENSE_MAX_BLOCK_D)
# The memory bandwidths a default may be chosen for (bytes/s): none known (the CPU), an H100's
# and an H200's, either side of dense.PER_DOCUMENT_MAX_BANDWIDTH.
CARD_BANDWIDTHS = (None, 3.35e12, 4.8e12)


@st.composite
def dense_configs(draw) -> MaxSimConfig | None:
    if draw(st.integers(0, 3)) == 0:
        return None
    kind = draw(st.sampled_from(DENSE_KINDS))
    config = MaxSimConfig(
        block_t=draw(st.sampled_from([16, 32, 64, 128, 1, 2, 4, 8])),
        queries_per_block=draw(st.sampled_from([1, 2, 4, 8])),
        q_blocks_per_program=draw(st.integers(1, 3)),
        docs_per_program=draw(st.integers(1, 4)),
        single_tile=kind == "single_tile", slots=kind == "slots", hold_query=kind == "hold_query",
        num_warps=draw(st.sampled_from([4, 1, 2, 8])), num_stages=draw(st.sampled_from([2, 1, 3])),
        block_d=draw(st.sampled_from((None, None) + DENSE_BLOCK_DS)),
        # The tiled paths' running max (tests/ops/test_dense.py refuses it elsewhere).
        running_max=kind in ("plain", "hold_query") and draw(st.booleans()),
        # The slots kernel's documents by length; drawn for any kind, as a user may set it.
        length_order=draw(st.integers(0, 3)) == 0,
    )
    return _maybe_malformed(draw, config, DENSE_MALFORMED)


@dataclasses.dataclass(frozen=True)
class DenseProblem:
    query: QuerySide
    packed: bool
    dist: str
    lengths: tuple[int, ...]
    padded_len: int  # padded layout: Ld >= every length
    with_doc_lengths: bool  # padded layout: pass the lengths (else every document has Ld tokens)
    pids: tuple[int, ...] | None  # packed layout only
    strided: bool
    config: MaxSimConfig | None
    seed: int
    # The default (config None) as a card of this bandwidth takes it, with every launch counted
    # as one of many documents (dense.MANY_DOCS = 1), so the defaults a GPU takes over a large
    # collection (the held query, per-document tiles, the flat walk) score these few documents.
    bandwidth: float | None = None
    many_docs: bool = False


@st.composite
def dense_problems(draw) -> DenseProblem:
    q = draw(query_sides())
    packed = draw(st.booleans())
    dist, lengths = draw(doc_lengths(q.dense_tokens()))
    with_doc_lengths = not packed and draw(st.booleans())
    # Padded without lengths every document has Ld tokens: the longest drawn length.
    padded_len = max(lengths) + (draw(st.integers(0, 3)) if with_doc_lengths else 0)
    config = draw(dense_configs())
    return DenseProblem(
        query=q, packed=packed, dist=dist, lengths=tuple(lengths), padded_len=padded_len,
        with_doc_lengths=with_doc_lengths,
        pids=draw(pid_lists(len(lengths))) if packed else None,
        strided=draw(st.booleans()), config=config, seed=draw(st.integers(0, 2**31 - 1)),
        bandwidth=draw(st.sampled_from(CARD_BANDWIDTHS)) if config is None else None,
        many_docs=config is None and draw(st.booleans()))


def dense_refusal(p: DenseProblem) -> str | None:
    """Why the op must refuse ``p.config`` for this input (None: it must not). The rules of
    MaxSimConfig's docstring and ops/dense._check_config."""
    cfg, d = p.config, p.query.d
    if cfg is None:
        return None
    if cfg.block_d is not None and cfg.block_d not in DENSE_BLOCK_DS:
        return f"block_d={cfg.block_d}"
    for name in ("block_t", "queries_per_block", "q_blocks_per_program", "docs_per_program"):
        value = getattr(cfg, name)
        if value < 1 or (name in ("block_t", "queries_per_block") and not _pow2(value)):
            return f"{name}={value}"
    if cfg.length_order and not cfg.slots:
        return "length_order: slots only"
    if cfg.slots and (cfg.q_blocks_per_program != 1 or not _pow2(cfg.docs_per_program)
                      or cfg.block_t * cfg.docs_per_program < MIN_DOT_DIM or not p.packed):
        return "slots: packed, one query block, a power-of-two of documents, >= 16 rows"
    chunks = -(-d // (cfg.block_d or DENSE_MAX_BLOCK_D))  # d <= 128: one chunk by default
    if cfg.hold_query and (chunks > MAX_HELD_CHUNKS or cfg.q_blocks_per_program != 1):
        return "hold_query: at most MAX_HELD_CHUNKS chunks of d and one query block per program"
    if p.packed or p.with_doc_lengths:
        max_doc_len = max(p.lengths)  # all documents' offsets are read, pids or not
    else:
        max_doc_len = p.padded_len
    if cfg.single_tile and (max_doc_len > cfg.block_t or chunks != 1):
        return "single_tile: every document within block_t and d <= 128"
    return None


def _dense_case(p: DenseProblem):
    g = torch.Generator().manual_seed(p.seed)
    Q, query_lengths = _queries(p.query, g)
    d, dtype = p.query.d, p.query.dtype
    view = _strided if p.strided else (lambda x: x)
    if p.packed:
        offsets = _offsets(p.lengths)
        D = (torch.randn(int(offsets[-1]), d, generator=g, dtype=torch.float64)
             / math.sqrt(d)).to(dtype).to(DEVICE)
        offsets = offsets.to(DEVICE)
        pids = None if p.pids is None else torch.tensor(p.pids, device=DEVICE)
        call = lambda: maxsim_packed(  # noqa: E731
            view(Q), view(D), view(offsets), None if pids is None else view(pids),
            query_lengths=None if query_lengths is None else view(query_lengths), config=p.config)
        expected = lambda: reference.maxsim_packed(  # noqa: E731
            Q, D, offsets, pids, query_lengths=query_lengths)
        return call, expected
    D = (torch.randn(len(p.lengths), p.padded_len, d, generator=g, dtype=torch.float64)
         / math.sqrt(d)).to(dtype).to(DEVICE)
    lengths = torch.tensor(p.lengths, device=DEVICE) if p.with_doc_lengths else None
    call = lambda: maxsim_padded(  # noqa: E731
        view(Q), view(D), None if lengths is None else view(lengths),
        None if query_lengths is None else view(query_lengths), config=p.config)
    expected = lambda: reference.maxsim_padded(Q, D, lengths, query_lengths)  # noqa: E731
    return call, expected


# The edges, run first: one token of d = 64 against a one-token and an empty document; the
# largest query side at d = 768 with slots; every document empty, queries half empty.
_DENSE_EDGES = [
    DenseProblem(QuerySide(1, 1, 64, torch.float16, None), True, "lognormal-30", (1, 0), 1, False,
                 None, False, None, 0),
    DenseProblem(QuerySide(32, 64, 768, torch.bfloat16, tuple(range(0, 64, 2))), True,
                 "heavy-512", (0, 17, 3), 17, False, (2, 0, 1, 1), True,
                 MaxSimConfig(block_t=16, queries_per_block=2, docs_per_program=2, slots=True), 1),
    DenseProblem(QuerySide(4, 33, 768, torch.float16, (33, 0, 1, 2)), False, "uniform-1-300",
                 (0, 0), 3, True, None, True, None, 2),
]
# The defaults a GPU takes for one query over a large collection (the held query; on a card of
# less bandwidth, per-document tiles, at d = 256 over 128-column chunks; the flat walk of short
# documents; the query held over padded ones), on a few documents with an empty and a
# one-token one, as strided views.
_H100, _H200 = CARD_BANDWIDTHS[1:]
_LONG = (70, 0, 1, 90, 100, 130)
_DENSE_DEFAULTS = [
    DenseProblem(QuerySide(1, 32, 128, torch.float16, None), True, "lognormal-70", _LONG, 130,
                 False, None, True, None, 3, bandwidth=_H200, many_docs=True),
    DenseProblem(QuerySide(1, 32, 128, torch.float16, None), True, "lognormal-70", _LONG, 130,
                 False, (5, 1, 3, 3), True, None, 4, bandwidth=_H100, many_docs=True),
    DenseProblem(QuerySide(1, 29, 256, torch.float16, None), True, "uniform-1-300",
                 (130, 0, 1, 257, 300, 80), 300, False, None, True, None, 5, bandwidth=_H100,
                 many_docs=True),
    DenseProblem(QuerySide(1, 32, 256, torch.bfloat16, None), True, "lognormal-70", _LONG, 130,
                 False, None, True, None, 6, bandwidth=_H200, many_docs=True),
    DenseProblem(QuerySide(1, 8, 96, torch.bfloat16, None), True, "lognormal-30",
                 (30, 0, 1, 17, 45, 29, 33), 45, False, None, True, None, 7, bandwidth=_H200,
                 many_docs=True),
    DenseProblem(QuerySide(1, 32, 128, torch.float16, None), False, "lognormal-30",
                 (30, 0, 1, 17, 45, 29, 33), 48, True, None, True, None, 8, bandwidth=_H100,
                 many_docs=True),
]


@grid_settings(36)
@given(problem=dense_problems())
@explicit_examples(_DENSE_EDGES + _DENSE_DEFAULTS)
def test_dense_over_the_grid(problem):
    """maxsim_packed and maxsim_padded over the grid's space with any MaxSimConfig, or the
    default as a drawn card takes it over many documents: exact within the dense tolerance, or
    refused naming the config."""
    call, expected = _dense_case(problem)
    with contextlib.ExitStack() as stack:
        if problem.bandwidth is not None:  # else this machine's (None on the CPU)
            stack.enter_context(mock.patch.object(dense, "memory_bandwidth",
                                                  lambda device: problem.bandwidth))
        stack.enter_context(_counted_as_many(dense, problem.many_docs))
        _check(call, dense_refusal(problem), expected, "maxsim_dense", problem.query.dtype)


# ---- residual codes: maxsim_residual and ResidualConfig ----

# Values no launch takes (ops/residual.check_config refuses them whatever the input).
RESIDUAL_MALFORMED = {"block_t": (0, 8, 24), "block_t_tail": (8, 12), "block_d": (0, 8, 48),
                      "queries_per_block": (0, 3), "docs_per_program": (0, -1),
                      "decode": ("lut", ""), "num_warps": (0, 3), "num_stages": (0,),
                      "maxnreg": (8, 300)}
MAX_CENTROIDS = 40


@st.composite
def residual_configs(draw) -> ResidualConfig | None:
    if draw(st.integers(0, 3)) == 0:
        return None
    config = ResidualConfig(
        block_t=draw(st.sampled_from([16, 32, 64])),
        block_t_tail=draw(st.sampled_from([16, 32])),
        block_d=draw(st.sampled_from([None, 16, 32, 64, 128])),
        queries_per_block=draw(st.sampled_from([1, 2, 4])),
        docs_per_program=draw(st.integers(1, 3)),
        centroid_table=draw(st.sampled_from([None, True, False])),
        decode=draw(st.sampled_from(sorted(DECODERS))),
        num_warps=draw(st.sampled_from([2, 1, 4])),
        num_stages=draw(st.sampled_from([1, 2])),
        maxnreg=draw(st.sampled_from([None, 96, 128, MIN_MAXNREG, MAX_MAXNREG])),
        ptx_loads=draw(st.sampled_from([None, False, True])),
        persistent=draw(st.booleans()),
        prefetch=draw(st.booleans()),
        half_table=draw(st.sampled_from([None, True, False])),
    )
    return _maybe_malformed(draw, config, RESIDUAL_MALFORMED)


@dataclasses.dataclass(frozen=True)
class ResidualProblem:
    query: QuerySide
    nbits: int
    num_centroids: int
    centroid_dtype: torch.dtype
    dist: str
    lengths: tuple[int, ...]
    with_norms: bool  # inv_norms given: the centroid-table path is open
    table: str  # "kernel" (built by the op), "fp32" or "fp16" (the caller's centroid_scores)
    split_query: bool
    rows: str  # residual rows: "contiguous", "padded" (row stride past the row) or "unaligned"
    pids: tuple[int, ...] | None
    strided: bool  # Q, centroids and the 1-D tensors as strided views
    config: ResidualConfig | None
    seed: int
    many_docs: bool = False  # config None: residual.MANY_DOCS = 1 (_counted_as_many)


@st.composite
def residual_problems(draw) -> ResidualProblem:
    q = draw(query_sides(max_rows=COMPRESSED_MAX_ROWS))
    dist, lengths = draw(doc_lengths(q.compressed_tokens()))
    with_norms = draw(st.booleans())
    split_query = q.dtype == torch.float32 and with_norms and draw(st.booleans())
    tables = ["kernel"] + (["fp32"] if with_norms else []) + (
        ["fp16"] if with_norms and q.dtype == torch.float16 else [])
    config = draw(residual_configs())
    return ResidualProblem(
        query=q, nbits=draw(st.sampled_from(SUPPORTED_NBITS)),
        num_centroids=draw(st.integers(1, MAX_CENTROIDS)),
        centroid_dtype=draw(st.sampled_from([torch.float16, torch.float32])),
        dist=dist, lengths=tuple(lengths), with_norms=with_norms,
        table=draw(st.sampled_from(tables)), split_query=split_query,
        rows=draw(st.sampled_from(["contiguous", "padded", "unaligned"])),
        pids=draw(pid_lists(len(lengths))), strided=draw(st.booleans()),
        config=config, seed=draw(st.integers(0, 2**31 - 1)),
        many_docs=config is None and draw(st.booleans()))


def _residual_rows(p: ResidualProblem, g: torch.Generator, num_tokens: int) -> torch.Tensor:
    width = p.query.d * p.nbits // 8
    if p.rows == "padded":  # row stride width + 1: rows past the first are not 4-byte aligned
        wide = torch.randint(0, 256, (num_tokens, width + 1), generator=g, dtype=torch.uint8)
        return wide.to(DEVICE)[:, :width]
    if p.rows == "unaligned":  # contiguous, one byte into its buffer
        flat = torch.randint(0, 256, (1 + num_tokens * width,), generator=g, dtype=torch.uint8)
        return flat.to(DEVICE)[1:].view(num_tokens, width)
    return torch.randint(0, 256, (num_tokens, width), generator=g, dtype=torch.uint8).to(DEVICE)


def residual_refusal(p: ResidualProblem, residuals: torch.Tensor) -> str | None:
    """Why the op must refuse ``p.config`` here (None: it must not): ResidualConfig's docstring,
    ops/residual.check_config and _launch_kernel."""
    cfg, q = p.config, p.query
    if cfg is None:
        return None
    if cfg.block_d is not None and (cfg.block_d < MIN_DOT_DIM or not _pow2(cfg.block_d)):
        return f"block_d={cfg.block_d}"
    if any(v < MIN_DOT_DIM or not _pow2(v) for v in (cfg.block_t, cfg.block_t_tail)):
        return f"block_t={cfg.block_t}, block_t_tail={cfg.block_t_tail}"
    if not _pow2(cfg.queries_per_block) or cfg.docs_per_program < 1:
        return f"queries_per_block={cfg.queries_per_block}, docs={cfg.docs_per_program}"
    if not _pow2(cfg.num_warps) or cfg.num_stages < 1:
        return f"num_warps={cfg.num_warps}, num_stages={cfg.num_stages}"
    if cfg.decode not in DECODERS:
        return f"decode={cfg.decode!r}"
    if cfg.maxnreg is not None and not MIN_MAXNREG <= cfg.maxnreg <= MAX_MAXNREG:
        return f"maxnreg={cfg.maxnreg}"
    builds_table = p.table == "kernel" and not p.split_query
    half_table = (builds_table and q.dtype == torch.float16 and p.with_norms
                  if cfg.half_table is None else cfg.half_table)
    if half_table and (q.dtype != torch.float16 or not builds_table):
        return "half_table: fp16 queries and a table built by the op"
    block_d = default_block_d(q.d) if cfg.block_d is None else cfg.block_d
    word_rows = (residuals.shape[1] % 4 == 0 and residuals.stride(0) % 4 == 0
                 and residuals.data_ptr() % 4 == 0 and block_d * p.nbits % 32 == 0)
    sixteen_bit = q.dtype != torch.float32 or p.split_query
    if cfg.decode == "permute" and not (p.nbits in (2, 4) and sixteen_bit and word_rows):
        return "permute: nbits = 2 or 4, 16-bit products, 4-byte aligned rows"
    if cfg.centroid_table and not p.with_norms:
        return "centroid_table=True without inv_norms"
    if p.split_query and cfg.centroid_table is False:
        return "split_query off the centroid-table path"
    block_q = max(cfg.queries_per_block, -(-MIN_DOT_DIM // _next_pow2(q.Lq)))
    if cfg.persistent and -(-q.B // block_q) != 1:
        return "persistent: one query block"
    return None


def _residual_case(p: ResidualProblem):
    g = torch.Generator().manual_seed(p.seed)
    q = p.query
    Q, query_lengths = _queries(q, g)
    offsets = _offsets(p.lengths)
    num_tokens = int(offsets[-1])
    centroids = F.normalize(torch.randn(p.num_centroids, q.d, generator=g), dim=-1)
    centroids = centroids.to(p.centroid_dtype).to(DEVICE)
    # Sorted and centred like colbert-ai's bucket quantiles of the residual distribution.
    weights = torch.sort(torch.randn(1 << p.nbits, generator=g) * 0.05).values.to(DEVICE)
    codes = torch.randint(0, p.num_centroids, (num_tokens,), generator=g,
                          dtype=torch.int32).to(DEVICE)
    residuals = _residual_rows(p, g, num_tokens)
    offsets = offsets.to(DEVICE)
    pids = None if p.pids is None else torch.tensor(p.pids, device=DEVICE)
    inv_norms = (residual_inverse_norms(codes, residuals, centroids, weights, p.nbits)
                 if p.with_norms else None)
    table = None
    if p.table != "kernel":
        rows = Q.reshape(-1, q.d).double()
        table_dtype = torch.float32 if p.table == "fp32" else torch.float16
        table = (centroids.double() @ rows.T).to(table_dtype)
    view = _strided if p.strided else (lambda x: x)
    opt = lambda x: None if x is None else view(x)  # noqa: E731
    call = lambda: maxsim_residual(  # noqa: E731
        view(Q), view(codes), residuals, view(offsets), view(centroids), view(weights), p.nbits,
        opt(pids), inv_norms=opt(inv_norms), query_lengths=opt(query_lengths),
        centroid_scores=opt(table), split_query=p.split_query, config=p.config)
    expected = lambda: reference.maxsim_residual(  # noqa: E731
        Q, codes, residuals, offsets, centroids, weights, p.nbits, pids,
        query_lengths=query_lengths)
    return call, expected, residuals


_RESIDUAL_EDGES = [
    # One query token at d = 64, nbits = 1 (8-byte rows), one centroid, empty documents.
    ResidualProblem(QuerySide(1, 1, 64, torch.float16, None), 1, 1, torch.float16, "lognormal-30",
                    (0, 1, 30, 0), True, "kernel", False, "contiguous", None, False, None, 0),
    # The largest query side, byte permutes, half the query rows empty.
    ResidualProblem(QuerySide(32, 64, 64, torch.float16, tuple(range(0, 64, 2))), 2, 40,
                    torch.float16, "heavy-512", (2, 0, 1), True, "kernel", False, "contiguous",
                    (2, 1, 1), True, ResidualConfig(decode="permute", queries_per_block=1), 1),
    # d = 768, fp32 split query with the caller's table, unaligned rows, nbits = 4.
    ResidualProblem(QuerySide(1, 33, 768, torch.float32, (33,)), 4, 7, torch.float16,
                    "uniform-1-300", (40, 0, 17), True, "fp32", True, "unaligned", (2, 0), True,
                    None, 2),
    # The defaults for many documents (one query: one-warp persistent programs): byte permutes
    # with codes a tile ahead beside the op's fp16 table (nbits = 2), the 128-register cap at
    # nbits = 4 (bf16, the fp32 table), the pair table for a split fp32 query (nbits = 1).
    ResidualProblem(QuerySide(1, 32, 128, torch.float16, None), 2, 20, torch.float16,
                    "lognormal-70", (40, 0, 1, 90, 17, 60), True, "kernel", False, "contiguous",
                    (3, 0, 5, 5), True, None, 3, many_docs=True),
    ResidualProblem(QuerySide(1, 29, 128, torch.bfloat16, None), 4, 9, torch.float32,
                    "lognormal-70", (40, 0, 1, 90, 17, 60), True, "kernel", False, "padded",
                    None, True, None, 4, many_docs=True),
    ResidualProblem(QuerySide(1, 32, 128, torch.float32, None), 1, 20, torch.float16,
                    "lognormal-70", (40, 0, 1, 90, 17, 60), True, "kernel", True, "unaligned",
                    None, True, None, 5, many_docs=True),
]


@grid_settings(30)
@given(problem=residual_problems())
@explicit_examples(_RESIDUAL_EDGES)
def test_residual_over_the_grid(problem):
    """maxsim_residual over the grid's space, nbits 1, 2 and 4, the gather and table paths (the
    op's table or the caller's, fp32 or fp16), split_query, unaligned residual rows and any
    ResidualConfig: exact within the residual tolerance, or refused naming the config."""
    call, expected, residuals = _residual_case(problem)
    op = "maxsim_residual_split" if problem.split_query else "maxsim_residual"
    with _counted_as_many(residual, problem.many_docs):
        _check(call, residual_refusal(problem, residuals), expected, op, problem.query.dtype)


# ---- PQ codes: maxsim_pq and PQConfig ----

# Values no launch takes (ops/pq.check_config refuses them whatever the input): tiles of the
# decode kernel under 16 tokens or not powers of two (block_t = 8 is refused with decode only).
PQ_DECODE_MALFORMED = {"block_t": (8, 24), "block_t_tail": (8, 12), "maxnreg": (8, 300),
                       "queries_per_block": (0, 3), "docs_per_program": (0,),
                       "num_warps": (3,), "num_stages": (0,), "scoring": ("tables", "")}
# The decode kernel's fields, which scoring="lut" refuses, lut_rows outside LUT_ROWS, and tiles
# that are not powers of two.
PQ_LUT_MALFORMED = {"persistent": (True,), "pipeline_codes": (True,), "reduce_per_tile": (True,),
                    "maxnreg": (128,), "lut_rows": (2, 64), "block_t": (0, 24),
                    "docs_per_program": (0,)}


@dataclasses.dataclass(frozen=True)
class PQProblem:
    query: QuerySide
    M: int
    mode: str  # "embeddings", "scaled" (inv_norms) or "residuals" (centroid codes, inv_norms)
    num_centroids: int
    dist: str
    lengths: tuple[int, ...]
    pids: tuple[int, ...] | None
    strided: bool  # every argument as a strided view
    config: PQConfig | None
    seed: int
    many_docs: bool = False  # config None: pq.MANY_DOCS = 1 (_counted_as_many)


@st.composite
def pq_configs(draw) -> PQConfig | None:
    if draw(st.integers(0, 3)) == 0:
        return None
    # mma applies to one shape on a GPU only (refused elsewhere): drawn a fifth of the time.
    scoring = draw(st.sampled_from(["decode", "lut", "decode", "lut", "mma"]))
    common = dict(scoring=scoring, block_t=draw(st.sampled_from([32, 16, 64])),
                  docs_per_program=draw(st.sampled_from([4, 1, 2, 3])),
                  num_warps=draw(st.sampled_from([4, 1, 2])),
                  num_stages=draw(st.sampled_from([2, 1])))
    if scoring == "lut":  # no tensor-core product: tiles of any power of two
        common["block_t"] = draw(st.sampled_from([32, 16, 64, 8, 1]))
        config = PQConfig(lut_rows=draw(st.sampled_from(LUT_ROWS)),
                          lut_shared=draw(st.sampled_from([None, False, True])), **common)
        return _maybe_malformed(draw, config, PQ_LUT_MALFORMED)
    config = PQConfig(block_t_tail=draw(st.sampled_from([16, 32])),
                      queries_per_block=draw(st.sampled_from([1, 2, 4])),
                      persistent=draw(st.booleans()),
                      maxnreg=draw(st.sampled_from([None, 128, MIN_MAXNREG, MAX_MAXNREG])),
                      reduce_per_tile=draw(st.booleans()),
                      pipeline_codes=draw(st.sampled_from([False, False, True])),
                      **common)
    return _maybe_malformed(draw, config, PQ_DECODE_MALFORMED)


@st.composite
def pq_problems(draw) -> PQProblem:
    q = draw(query_sides(max_rows=COMPRESSED_MAX_ROWS))
    config = draw(pq_configs())
    divisors = [m for m in range(1, q.d + 1) if q.d % m == 0]
    dist, lengths = draw(doc_lengths(q.compressed_tokens()))
    return PQProblem(
        query=q, M=draw(st.sampled_from(divisors)),
        mode=draw(st.sampled_from(["embeddings", "scaled", "residuals"])),
        num_centroids=draw(st.integers(1, MAX_CENTROIDS)), dist=dist, lengths=tuple(lengths),
        pids=draw(pid_lists(len(lengths))), strided=draw(st.booleans()), config=config,
        seed=draw(st.integers(0, 2**31 - 1)), many_docs=config is None and draw(st.booleans()))


def pq_refusal(p: PQProblem, Q: torch.Tensor, pq_codes: torch.Tensor, extra: dict) -> str | None:
    """Why the op must refuse ``p.config`` here (None: it must not): PQConfig's docstring,
    ops/pq.check_config, _launch_kernel and _launch_lut, and the mma and shared-table kernels'
    own rules."""
    cfg, q = p.config, p.query
    if cfg is None:
        return None
    if cfg.scoring not in SCORING:
        return f"scoring={cfg.scoring!r}"
    # Every field, whatever the scoring.
    if not all(_pow2(v) for v in (cfg.block_t, cfg.block_t_tail, cfg.queries_per_block,
                                  cfg.num_warps)):
        return "block_t, block_t_tail, queries_per_block and num_warps: powers of two"
    if cfg.docs_per_program < 1 or cfg.num_stages < 1:
        return f"docs_per_program={cfg.docs_per_program}, num_stages={cfg.num_stages}"
    if cfg.maxnreg is not None and not MIN_MAXNREG <= cfg.maxnreg <= MAX_MAXNREG:
        return f"maxnreg={cfg.maxnreg}"
    if cfg.lut_rows not in LUT_ROWS:
        return f"lut_rows={cfg.lut_rows}"
    if cfg.scoring == "lut":
        if cfg.persistent or cfg.pipeline_codes or cfg.reduce_per_tile or cfg.maxnreg is not None:
            return "lut: none of the decode kernel's fields"
        if cfg.lut_shared and pq_lut_shared.reasons_not_to_apply(Q, p.M, cfg.lut_rows):
            return "lut_shared=True where the shared-memory kernel does not apply"
        return None
    if cfg.scoring == "mma":
        reasons = pq_mma.reasons_not_to_apply(Q, pq_codes.contiguous(), torch.empty(
            p.M, 256, q.d // p.M), extra.get("centroid_codes"), extra.get("inv_norms"))
        return "mma: " + "; ".join(reasons) if reasons or not nvrtc.available() else None
    if min(cfg.block_t, cfg.block_t_tail) < MIN_DOT_DIM:
        return f"decode: block_t={cfg.block_t}, block_t_tail={cfg.block_t_tail} >= 16"
    # Word gathers: 16-bit queries, an even power-of-two d/M and whole chunks of a multiple of 4
    # sub-quantizers (the op copies pq_codes and the codebooks to aligned tensors).
    sub_dim = q.d // p.M
    m_block, num_m_blocks, _ = subquantizer_blocking(p.M, sub_dim)
    words = (q.dtype != torch.float32 and sub_dim % 2 == 0 and _pow2(sub_dim)
             and m_block % 4 == 0 and p.M % m_block == 0 and p.M % 4 == 0)
    if cfg.pipeline_codes and not (words and num_m_blocks == 1):
        return "pipeline_codes: word gathers, one chunk of sub-quantizers"
    block_q = max(cfg.queries_per_block, -(-MIN_DOT_DIM // _next_pow2(q.Lq)))
    if cfg.persistent and -(-q.B // block_q) != 1:
        return "persistent: one query block"
    return None


def _pq_tolerance_dtype(p: PQProblem) -> torch.dtype:
    """Lookup tables are fp32 sums of float64 products; the other scorings multiply in Q's dtype."""
    lut = p.config is not None and p.config.scoring == "lut"
    return torch.float32 if lut else p.query.dtype


def _pq_case(p: PQProblem):
    g = torch.Generator().manual_seed(p.seed)
    q = p.query
    Q, query_lengths = _queries(q, g)
    offsets = _offsets(p.lengths)
    num_tokens = int(offsets[-1])
    # Codebooks scaled like sub-vectors of unit embeddings.
    codebooks = (torch.randn(p.M, 256, q.d // p.M, generator=g) / math.sqrt(q.d)).to(DEVICE)
    pq_codes = torch.randint(0, 256, (num_tokens, p.M), generator=g, dtype=torch.uint8).to(DEVICE)
    extra = {}
    if p.mode != "embeddings":
        extra["inv_norms"] = (1.0 / (1.0 + torch.rand(num_tokens, generator=g))).to(DEVICE)
    if p.mode == "residuals":
        extra["centroid_codes"] = torch.randint(0, p.num_centroids, (num_tokens,), generator=g,
                                                dtype=torch.int32).to(DEVICE)
        extra["centroids"] = F.normalize(torch.randn(p.num_centroids, q.d, generator=g),
                                         dim=-1).half().to(DEVICE)
    offsets = offsets.to(DEVICE)
    pids = None if p.pids is None else torch.tensor(p.pids, device=DEVICE)
    view = _strided if p.strided else (lambda x: x)
    opt = lambda x: None if x is None else view(x)  # noqa: E731
    call = lambda: maxsim_pq(  # noqa: E731
        view(Q), view(pq_codes), view(offsets), view(codebooks), opt(pids),
        query_lengths=opt(query_lengths), config=p.config,
        **{name: view(value) for name, value in extra.items()})
    expected = lambda: reference.maxsim_pq(  # noqa: E731
        Q, pq_codes, offsets, codebooks, pids, query_lengths=query_lengths, **extra)
    return call, expected, Q, pq_codes, extra


_PQ_EDGES = [
    # One query token at d = 64 as M = 16 of 4 dims, an empty document.
    PQProblem(QuerySide(1, 1, 64, torch.float16, None), 16, "embeddings", 1, "lognormal-30",
              (0, 1, 29), None, False, None, 0),
    # The largest query side over PLAID residuals, with lookup tables of M = 1 (d/M = 64).
    PQProblem(QuerySide(32, 64, 64, torch.bfloat16, tuple(range(0, 64, 2))), 1, "residuals", 40,
              "heavy-512", (2, 0, 1), (2, 1, 1), True, PQConfig(scoring="lut", lut_rows=32), 1),
    # d = 768 as M = 48 of 16 dims, fp32 queries, scaled codes.
    PQProblem(QuerySide(1, 33, 768, torch.float32, None), 48, "scaled", 1, "uniform-1-300",
              (40, 0, 17), (2, 0), True, PQConfig(block_t=16, docs_per_program=3), 2),
    # The decode kernel's defaults for many documents (one query: one-warp persistent
    # programs): d = 128 as M = 16 (4 documents a chunk, tiles reduced as they come, codes a
    # tile ahead) over PLAID residuals, and as M = 8 (2 documents a chunk).
    PQProblem(QuerySide(1, 32, 128, torch.float16, None), 16, "residuals", 20, "lognormal-70",
              (40, 0, 1, 90, 17, 60), (3, 0, 5, 5), True, None, 3, many_docs=True),
    PQProblem(QuerySide(1, 31, 128, torch.bfloat16, None), 8, "scaled", 1, "lognormal-70",
              (40, 0, 1, 90, 17, 60), None, True, None, 4, many_docs=True),
]


@grid_settings(30)
@given(problem=pq_problems())
@explicit_examples(_PQ_EDGES)
def test_pq_over_the_grid(problem):
    """maxsim_pq over the grid's space, every M that divides d (the decode kernel's where it
    compiles), codes of embeddings, scaled or of PLAID residuals, and any PQConfig: exact to
    the decoded vectors within the PQ tolerance, or refused naming the config."""
    call, expected, Q, pq_codes, extra = _pq_case(problem)
    with _counted_as_many(pq, problem.many_docs):
        _check(call, pq_refusal(problem, Q, pq_codes, extra), expected, "maxsim_pq",
               _pq_tolerance_dtype(problem))


# ---- the strategies follow the grid ----

def test_strategies_span_the_grid_axes():
    """The axes drawn here are the shape grid's: its B values, query lengths and dimensions lie
    in the drawn ranges, its distributions are the ones drawn (same log-normal parameters: the
    means of a large sample agree), and the config strategies name only real fields."""
    from experiments import bench_grid

    axes = bench_grid.AXES["full"]
    assert set(axes["sweep_B"]) | set(axes["grid_B"]) <= set(BATCH_SIZES)
    assert set(axes["sweep_Lq"]) | set(axes["grid_Lq"]) <= set(range(1, MAX_LQ + 1))
    assert set(axes["sweep_d"]) | set(axes["grid_d"]) <= set(DIMS)
    assert set(bench_grid.DTYPES.values()) <= set(DTYPES)
    assert set(bench_grid.DISTRIBUTIONS) == set(LOGNORMALS) | set(UNIFORMS)
    z = torch.randn(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for dist, (mean, sigma, cap) in LOGNORMALS.items():
        mu = math.log(mean) - sigma**2 / 2
        ours = torch.exp(mu + sigma * z).round().clamp(1, cap).mean()
        assert abs(float(ours) - bench_grid.mean_length(dist)) < 0.05 * mean, dist
    for malformed, cls in ((DENSE_MALFORMED, MaxSimConfig), (RESIDUAL_MALFORMED, ResidualConfig),
                           (PQ_DECODE_MALFORMED, PQConfig), (PQ_LUT_MALFORMED, PQConfig)):
        assert set(malformed) <= {f.name for f in dataclasses.fields(cls)}


# ---- the smallest example of each rule the properties found broken ----

@pytest.mark.parametrize("d,M", [pytest.param(64, 2, id="d64-M2"),
                                 pytest.param(64, 1, id="d64-M1"),
                                 pytest.param(96, 2, id="d96-M2-dsub48"),
                                 pytest.param(768, 16, id="d768-M16-dsub48"),
                                 pytest.param(768, 3, id="d768-M3-dsub256")])
@pytest.mark.parametrize("config", [
    pytest.param(None, id="default"),
    pytest.param(PQConfig(block_t=16, num_warps=1, docs_per_program=2, reduce_per_tile=True),
                 id="one-warp-reduced"),
    pytest.param(PQConfig(block_t=32, block_t_tail=32, persistent=True), id="persistent")])
def test_pq_decode_of_wide_subvectors(d, M, config):
    """Chunks of fewer sub-quantizers than a code word holds (M < 4, or d/M > 32: byte
    gathers) decode like any other: the kernel's code-word placeholder has a legal shape."""
    problem = PQProblem(QuerySide(1, 3, d, torch.float16, None), M, "embeddings", 1,
                        "lognormal-30", (5, 3, 0, 40), None, False, config, 0)
    call, expected, *_ = _pq_case(problem)
    _check(call, None, expected, "maxsim_pq", torch.float16)


@pytest.mark.parametrize("op,config", [
    pytest.param("residual", ResidualConfig(docs_per_program=0), id="residual-docs0"),
    pytest.param("residual", ResidualConfig(queries_per_block=3), id="residual-qpb3"),
    pytest.param("residual", ResidualConfig(block_d=0), id="residual-block_d0"),
    pytest.param("residual", ResidualConfig(num_warps=3), id="residual-warps3"),
    pytest.param("residual", ResidualConfig(prefetch="yes"), id="residual-prefetch-str"),
    pytest.param("pq", PQConfig(docs_per_program=0), id="pq-docs0"),
    pytest.param("pq", PQConfig(queries_per_block=3), id="pq-qpb3"),
    pytest.param("pq", PQConfig(num_stages=0), id="pq-stages0"),
    pytest.param("pq", PQConfig(lut_rows=5), id="pq-lut_rows5"),
    pytest.param("pq", PQConfig(scoring="lut", docs_per_program=0), id="pq-lut-docs0"),
    pytest.param("pq", PQConfig(scoring="lut", block_t=24), id="pq-lut-block_t24"),
    pytest.param("pq", PQConfig(scoring="mma", block_t=24), id="pq-mma-block_t24"),
])
def test_compressed_config_fields_refused(op, config):
    """Every field of ResidualConfig and PQConfig is checked, whichever path would ignore it,
    with a ValueError naming the config."""
    q = QuerySide(2, 9, 64, torch.float16, None)
    if op == "residual":
        call, expected, _ = _residual_case(ResidualProblem(
            q, 2, 5, torch.float16, "lognormal-30", (10, 20, 0), False, "kernel", False,
            "contiguous", None, False, config, 0))
    else:
        call, expected, *_ = _pq_case(PQProblem(q, 8, "embeddings", 1, "lognormal-30",
                                                (10, 20, 0), None, False, config, 0))
    _check(call, "malformed", expected, "maxsim_" + op, torch.float16)


@pytest.mark.parametrize("op", ["dense", "residual", "pq"])
def test_malformed_config_refused_with_nothing_to_score(op):
    """No documents to score: the config is checked all the same."""
    q = QuerySide(1, 4, 64, torch.float16, None)
    if op == "dense":
        call, expected = _dense_case(DenseProblem(q, True, "lognormal-30", (), 0, False, None,
                                                  False, MaxSimConfig(block_t=3), 0))
    elif op == "residual":
        call, expected, _ = _residual_case(ResidualProblem(
            q, 2, 5, torch.float16, "lognormal-30", (), False, "kernel", False, "contiguous",
            None, False, ResidualConfig(block_t=3), 0))
    else:
        call, expected, *_ = _pq_case(PQProblem(q, 8, "embeddings", 1, "lognormal-30", (),
                                                None, False, PQConfig(block_t=3), 0))
    _check(call, "malformed", expected, "maxsim_" + op, torch.float16)
