"""Host side of fused residual-code MaxSim: check inputs, allocate, pick a config, launch."""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch

from tilemaxsim_plaid.codecs.residual import SUPPORTED_NBITS, field_order_weights
from tilemaxsim_plaid.kernels.maxsim_residual import (
    _maxsim_residual_kernel,
    _query_centroid_scores_kernel,
)
from tilemaxsim_plaid.ops import checks, nvrtc, residual_mma
from tilemaxsim_plaid.ops.centroid import cells_from_blocks
from tilemaxsim_plaid.ops.launch import (
    FLAG,
    MAX_LQ_PER_LAUNCH,
    NUM_STAGES,
    NUM_WARPS,
    OPTIONAL_FLAG,
    at_least,
    cdiv,
    check_config_fields,
    document_grid,
    dot_precision,
    interpreter_upcast,
    interpreting,
    launch_in_query_chunks,
    one_of,
    optional,
    optional_range,
    pow2,
    power_of_two,
    scoring_op,
)

logger = logging.getLogger(__name__)

__all__ = ["ResidualConfig", "MMA_DEFAULT", "MMA_NBITS", "mma_default", "centroid_table_fits",
           "centroid_table_tiles", "check_config", "decode_table", "default_residual_config",
           "maxsim_residual", "query_centroid_scores", "split_query_centroid_scores",
           "split_query_centroid_probe"]

# A [BLOCK_Q, BLOCK_T] fp32 block of scores per tile: 128 query rows is what registers hold
# comfortably; longer queries are scored in chunks and the chunk scores summed.
# One 128-wide chunk of the embedding per tensor-core product: d = 384 is 3 chunks.
MAX_BLOCK_D = 128
# tl.dot needs every dimension >= 16.
MIN_DOT_DIM = 16
# The per-query centroid table S = centroids @ Q^T is gathered once per token (one row of B*Lq
# entries, in the dtype it is built in: fp16 for fp16 queries, else fp32); it pays off while it
# stays in L2 (60 MB on an H200, 50 MB on an H100, shared with the streamed codes), so one
# launch's table may take under half of it. A larger table is split over launches by query rows
# (centroid_table_tiles); where a tile would be narrower than MIN_TABLE_TILE_ROWS the kernel
# gathers centroid rows instead (256 B per token at d = 128) and decodes with the pair table.
# Except one query's table (at most WHOLE_TABLE_ROWS query rows), used whole however large: a
# split decodes every document again per tile (and copies a caller's table tile by tile), which
# costs more than the L2 misses of a table larger than L2; where the table is given (PLAID's
# stage 1) or split_query needs one, it also beats gathered rows. Where the op would build it
# itself, it gathers instead where no tile fits (fp16 rows at C = 2^20) and for one fp16 query
# over fewer than MANY_DOCS documents, where the build costs more than the lookups save
# (results/stage4_table/h100-b9d639e, results/stage4_table/h100-f86ce8a-fp16).
# centroid_table_fits, centroid_table_tiles and _use_table are the one place this is judged.
MAX_CENTROID_TABLE_BYTES = 24 << 20
WHOLE_TABLE_ROWS = 64
# The narrowest tile of a split table (a whole query may be narrower): the tensor cores multiply
# at least 16 query columns, so a narrower tile pays a whole pass over the documents' codes for
# products that are partly padding.
MIN_TABLE_TILE_ROWS = MIN_DOT_DIM
# Tiles of the per-batch table build (table_tile): 64 centroids against the query rows rounded up
# to a power of two, at most TABLE_MAX_BLOCK_R, so the centroids are read once for up to 128
# rows; one stage, as the product at d <= 128 is one step (measured against 64 x 64 with three
# stages and wider centroid blocks: results/PERFORMANCE_LOG.md, run 154).
TABLE_BLOCK_C, TABLE_MAX_BLOCK_R, TABLE_NUM_STAGES = 64, 128, 1


def table_tile(rows: int) -> tuple[int, int]:
    """(query rows per block, warps) of the table build over ``rows`` query rows."""
    block_r = min(TABLE_MAX_BLOCK_R, max(MIN_DOT_DIM, pow2(rows)))
    return block_r, 8 if block_r >= 128 else 4
# The split build (fp16 centroids, fp32 query, fp16 tensor cores) streams the fp16 centroids once:
# 128-centroid blocks against up to 64 query rows.
SPLIT_TABLE_BLOCK_C, SPLIT_TABLE_MAX_BLOCK_R = 128, 64
# The kernel addresses the centroid table and S with int32 offsets (code * row stride).
MAX_INT32_OFFSET = 2**31 - 1
# Residual rows are read as 32-bit words when rows, row stride and base are 4-byte aligned.
WORD_BYTES = 4
# From this many scored documents on, one query is scored by a persistent grid of one-warp
# programs that take documents two at a time (default_residual_config): enough documents that
# every program walks several (132 SMs x ~20 resident one-warp programs x 2 is ~5k).
MANY_DOCS = 16384
# How bits become weights (kernels/maxsim_residual.py): "pairs" looks up two weights per load in
# a 2**(2*nbits)-entry table; "select" picks one weight per dimension with a select tree;
# "permute" (nbits = 2 or 4, 32-bit word units, 16-bit products) assembles the weights by PTX
# byte permutes from their bytes held in registers, with no lookup at all. The kernel's
# DECODE_GROUP: dimensions per lookup (0: none).
DECODERS = {"select": 1, "pairs": 2, "permute": 0}
PERMUTE_NBITS = (2, 4)
SCORING = ("decode", "mma")


@dataclasses.dataclass(frozen=True)
class ResidualConfig:
    """One fixed launch configuration for :func:`maxsim_residual` (no shape heuristics: passing
    one makes a launch reproducible and CUDA-graph friendly; the mma kernel's L2 policies still
    follow the table's size, ``residual_mma.l2_hints``). :func:`default_residual_config` picks
    one by shape; the field defaults are its choice for one query over few documents: per-document
    programs of 2 warps (many small programs resident per SM hide one another's dependent
    codes -> S-row loads) walking 16-token tiles with the pair decoder.

    Every field is checked against CONFIG_FIELDS before anything is scored (a ValueError
    naming it); whether a valid config applies to the input is judged at launch.

    Attributes:
        block_t: tokens per main tile (the tensor-core M dimension), a power of two >= 16.
        block_t_tail: tokens per tile for the remainder of a document (< block_t tokens), so a
            document costs at most block_t_tail - 1 masked rows; a power of two >= 16.
        block_d: embedding columns per chunk (a power of two >= 16); None: default_block_d.
        queries_per_block: queries stacked into one tensor-core product, a power of two.
        docs_per_program: documents one program walks (amortises its query block and weights),
            at least 1.
        centroid_table: True: centroid scores from the per-batch table (needs inv_norms);
            False: gather centroid rows; None: the table, in the dtype it is built in (fp16
            with half_table), over as many launches by query rows as it takes for each
            launch's table to fit MAX_CENTROID_TABLE_BYTES (centroid_table_tiles, logged once),
            gathered where even a MIN_TABLE_TILE_ROWS-row tile does not fit (logged once); one
            query's table (WHOLE_TABLE_ROWS) whole in one launch instead of split, and instead
            of gathered where it is given or split_query needs it; one fp16 query over fewer
            than MANY_DOCS documents gathered (building its table costs more there).
        decode: "pairs" (two weights per table load), "select" (a select tree per dimension),
            or "permute" (no table lookups: weights by byte permutes from registers; nbits = 2
            or 4, 4-byte aligned residual rows, 16-bit products only).
            Byte-unit rows in chunks narrower than 128 columns always decode with "select".
        num_warps, num_stages: Triton launch parameters (a power of two; at least 1). One
            stage: deeper pipelining costs registers and occupancy here (see
            results/compressed/h200-final).
        maxnreg: a cap on registers per thread (ptx .maxnreg, MIN_MAXNREG..MAX_MAXNREG), or
            None for the compiler's choice. Fewer registers let more programs share an SM,
            which hides the latency of each program's dependent loads; too few make the
            compiler spill.
        ptx_loads: read residual words and pair-table entries with inline-PTX loads, which
            land in the tensor-core operand's layout instead of crossing shared memory on every
            tile. None: on a GPU; the CPU interpreter cannot run PTX, so there it is always off.
        persistent: a fixed grid of programs (ops.launch.document_grid) that take chunks of
            docs_per_program documents from an atomic counter until none are left, instead of
            one program per chunk: no last wave running alone. One query block only.
        prefetch: ask L2 for each document's codes, residual rows and inverse norms past its
            first tile before walking it (GPU only: a hint the interpreter skips).
        pipeline_codes: load each main tile's centroid codes while the tile before it is
            scored, so the tile's centroid-score rows (or centroid rows) are gathered without
            first waiting for its codes; the masked load adds instructions to every tile
            (results/sass_budget/sm90-triton3.6-620bbb1-pipeline_codes).
        scoring: "decode" (the Triton kernel, kernels/maxsim_residual.py, which every other
            field configures) or "mma" (kernels/maxsim_residual_mma.cu by NVRTC: each lane
            decodes the tensor-core operand it multiplies, with one shared-memory load per
            residual byte; d = 128, nbits 2 or 4, 16-bit queries, the table path:
            ops/residual_mma.py). With "mma" only docs_per_program (documents a warp takes
            per grab), prefetch (each next document into L2 while one is scored) and
            half_table apply.
        half_table: build the centroid-score table in fp16 (fp16 queries only): 64 B gathered
            per token instead of 128. Each entry <q, c> of the fp16 query and centroid is exact
            in fp32 and then rounded once (2**-11 relative), the rounding colbert-ai's own fp16
            score matrix carries. None: for fp16 queries when the kernel builds the table (a
            caller's table is used as given).
    """

    block_t: int = 16
    block_t_tail: int = 16
    block_d: int | None = None
    queries_per_block: int = 1
    docs_per_program: int = 1
    centroid_table: bool | None = None
    decode: str = "pairs"
    num_warps: int = 2
    num_stages: int = 1
    maxnreg: int | None = None
    ptx_loads: bool | None = None
    persistent: bool = False
    prefetch: bool = False
    half_table: bool | None = None
    pipeline_codes: bool = False
    scoring: str = "decode"


# The one-warp default's register cap; nbits = 4's decoders spill under it and take 128, as
# split_query does (results/PERFORMANCE_LOG.md, runs 98, 106 and 132).
ONE_WARP_MAXNREG = 96
# ptxas's range for .maxnreg on sm_80/sm_90.
MIN_MAXNREG, MAX_MAXNREG = 24, 255

# What each field of a ResidualConfig takes, whatever the input (ops.launch.check_config_fields).
# Tile sizes are tl.arange extents; block_t, block_t_tail and block_d are also tl.dot extents.
CONFIG_FIELDS = {
    "block_t": power_of_two(MIN_DOT_DIM),
    "block_t_tail": power_of_two(MIN_DOT_DIM),
    "block_d": optional(power_of_two(MIN_DOT_DIM)),
    "queries_per_block": power_of_two(1),
    "docs_per_program": at_least(1),
    "centroid_table": OPTIONAL_FLAG,
    "decode": one_of(DECODERS),
    "num_warps": NUM_WARPS,
    "num_stages": NUM_STAGES,
    "maxnreg": optional_range(MIN_MAXNREG, MAX_MAXNREG),
    "ptx_loads": OPTIONAL_FLAG,
    "persistent": FLAG,
    "prefetch": FLAG,
    "half_table": OPTIONAL_FLAG,
    "pipeline_codes": FLAG,
    "scoring": one_of(SCORING),
}


# The mma kernel's launch where the default takes it: scoring="mma" applies, nbits is in
# MMA_NBITS and at least MANY_DOCS documents are scored. MMA_NBITS holds the bit widths where it
# was measured faster than the Triton kernel's launch, side by side (experiments/
# bench_residual_scale; results/PERFORMANCE_LOG.md, run 151).
MMA_DEFAULT = ResidualConfig(scoring="mma", docs_per_program=residual_mma.DEFAULT_GRAB,
                             prefetch=True)
MMA_NBITS: tuple[int, ...] = (2, 4)
_MMA_DEFAULT_NO_PREFETCH = dataclasses.replace(MMA_DEFAULT, prefetch=False)


def mma_default(l2_hints: bool) -> ResidualConfig:
    """MMA_DEFAULT, without its L2 prefetch where the launch takes the L2 policies
    (``residual_mma.takes_l2_hints``): the prefetch pays beside a table that L2 holds without
    them and costs beside one it is told to keep (results/PERFORMANCE_LOG.md, runs 153 and 160)."""
    return _MMA_DEFAULT_NO_PREFETCH if l2_hints else MMA_DEFAULT


def check_config(cfg: ResidualConfig) -> None:
    """A ValueError naming the first field of ``cfg`` outside CONFIG_FIELDS' rules. Whether a
    valid config applies to an input (permute, half_table, centroid_table, persistent) is
    judged at launch."""
    check_config_fields(cfg, CONFIG_FIELDS)



def default_block_d(dim: int) -> int:
    """One chunk when d <= 128 (masked if d is not a power of two, so the query chunk stays in
    registers); above, the largest power of two <= 128 that divides d, so nothing is masked."""
    if dim <= MAX_BLOCK_D:
        return max(MIN_DOT_DIM, pow2(dim))
    block = MAX_BLOCK_D
    while block > 32 and dim % block:
        block //= 2
    return block if dim % block == 0 else MAX_BLOCK_D


def default_residual_config(num_queries: int, Lq: int, split_query: bool = False,
                            num_docs: int = 0, element_size: int = 2,
                            half_table: bool = False, nbits: int = 2) -> ResidualConfig:
    """Deterministic heuristic, no autotuning at call time (rules measured on the H200 in
    interleaved rounds of experiments/profile_kernels.py; see results/PERFORMANCE_LOG.md, runs 43
    and 116).

    One query block of at most 32 rows (one query: a rerank, or stage 4 of a large search):

    * At least MANY_DOCS documents with 16-bit products (fp16/bf16 queries, or split_query):
      one-warp programs of 16-token tiles on a persistent grid taking 2 documents at a time,
      with a register cap (96; 128 with split_query's second query operand, and at nbits = 4,
      whose decoders spill under 96). A 2-warp program
      splits a 16-token tile's products by query columns, so both warps decode the whole tile;
      one warp decodes it once, and the cap fits more programs per SM; the persistent grid has
      no last wave running alone. 16-bit queries decode by byte permutes (no table loads)
      where they apply, split_query by the pair table; with an fp16 centroid-score table
      (half_table) each document's rows are also prefetched into L2. Beside byte permutes each
      tile's codes are loaded a tile ahead (pipeline_codes).
    * Fewer documents (the search path's stage 4 scores at most a few thousand): 2-warp
      programs, which keep more warps on each document: ResidualConfig's defaults, and 32-token
      tiles with split_query.
    * fp32 products (tf32x3, element_size 4): the defaults; their 200-register tiles would spill
      under a cap.

    Several queries: a query block of up to 64 rows (two 32-token queries) fills the tensor-core
    N dimension without spilling the [BLOCK_T, 64] score block, with 4 warps to share it.
    """
    lq = pow2(Lq)
    queries_per_block = max(1, min(pow2(num_queries), max(MIN_DOT_DIM, 64) // lq))
    if queries_per_block * lq <= 32:
        if num_docs >= MANY_DOCS and (split_query or element_size == 2):
            # Here queries_per_block = pow2(num_queries): every query is in the one block, as
            # a persistent grid needs. An L2 prefetch pays beside the fp16 table only (more L2
            # traffic beside the fp32 table's 128-B rows); byte permutes were slower than pairs
            # with split_query. Codes a tile ahead gain beside byte permutes, not beside pairs
            # (results/residual_scale/h200-975e3d8-pipelined).
            permutes = not split_query and nbits in PERMUTE_NBITS
            return ResidualConfig(queries_per_block=queries_per_block, num_warps=1,
                                  maxnreg=128 if split_query or nbits == 4
                                  else ONE_WARP_MAXNREG,
                                  docs_per_program=2,
                                  persistent=True, prefetch=half_table,
                                  decode="permute" if permutes else "pairs",
                                  pipeline_codes=permutes)
        return ResidualConfig(queries_per_block=queries_per_block, block_t=32 if split_query else 16)
    return ResidualConfig(queries_per_block=queries_per_block, num_warps=4)


@functools.cache
def _decode_table_index(nbits: int, group: int, device: torch.device) -> torch.Tensor:
    """What :func:`decode_table` gathers, flat: for group 1 the bucket of each field; for
    group 2 the buckets of each entry's two fields (weights' bits, entry by entry)."""
    # field -> bucket (colbert-ai's bits are reversed within a field), from the codec's own rule.
    bucket_of_field = field_order_weights(torch.arange(1 << nbits, dtype=torch.float32),
                                          nbits).long()
    if group == 1:
        return bucket_of_field.to(device)
    fields = torch.arange(1 << (group * nbits))
    # A group's first dimension is its highest field (packbits is big-endian within a byte).
    mask = (1 << nbits) - 1
    per_dim = [(fields >> (nbits * (group - 1 - p))) & mask for p in range(group)]
    return torch.stack([bucket_of_field[f] for f in per_dim], dim=1).reshape(-1).to(device)


def decode_table(bucket_weights: torch.Tensor, nbits: int, dtype: torch.dtype,
                 group: int) -> torch.Tensor:
    """The weight table the kernel decodes with, in the dot dtype's bits; ``group`` is the
    kernel's decoder (DECODERS: 1-2 dimensions per lookup; the byte permutes, 0, take the bucket
    weights themselves). One gather of the weights (after their cast to ``dtype``), so it costs
    a call two launches at most.

    1: [2**nbits] weights in ``dtype`` indexed by the raw field.
    2: [2**(2*nbits)] int32 (fp16/bf16) or int64 (fp32): entry f holds the weights of the fields
    ``f >> nbits`` (low half) and ``f & (2**nbits - 1)`` (high half), so one load gives two
    adjacent dimensions.
    """
    weights = bucket_weights.reshape(-1).to(dtype)
    if group not in (1, 2):
        raise ValueError(f"group must be 1 or 2 (the byte permutes, 0, need no table), got "
                         f"{group}")
    index = _decode_table_index(nbits, group, weights.device)
    if group == 1:
        return weights.index_select(0, index)
    bits = {2: (torch.int16, torch.int32), 4: (torch.int32, torch.int64)}[weights.element_size()]
    return weights.view(bits[0]).index_select(0, index).view(bits[1])


def _permute_applies(Q3, residuals, nbits, split_query, block_d) -> bool:
    """Whether the byte-permute decoder can serve this call: nbits = 2 or 4, 16-bit products
    and residual rows read as 32-bit words."""
    return (nbits in PERMUTE_NBITS and (Q3.element_size() == 2 or split_query)
            and _unit_bytes(residuals, block_d, nbits) == WORD_BYTES)


def _ptx_loads(cfg: ResidualConfig) -> bool:
    if interpreting():
        return False  # the interpreter runs no PTX
    return True if cfg.ptx_loads is None else cfg.ptx_loads


def _unit_bytes(residuals: torch.Tensor, block_d: int, nbits: int) -> int:
    """4 (read rows as int32 words: a quarter of the load instructions) when every row starts
    4-byte aligned and is whole words, and a d-chunk is whole words; else 1 (bytes)."""
    aligned = (residuals.shape[1] % WORD_BYTES == 0 and residuals.stride(0) % WORD_BYTES == 0
               and residuals.data_ptr() % WORD_BYTES == 0
               and block_d * nbits % (8 * WORD_BYTES) == 0)
    return WORD_BYTES if aligned else 1


def query_centroid_scores(Q3: torch.Tensor, centroids: torch.Tensor,
                          dtype: torch.dtype = torch.float32,
                          permuted: bool = False) -> torch.Tensor:
    """S = centroids @ Q_rows^T: [C, B * Lq] for Q3 [B, Lq, d], accumulated in fp32 and stored
    in ``dtype`` (fp32, or fp16: each entry rounded once).

    Products are taken in Q's dtype when the centroids share it (fp16/bf16 tensor cores; fp32 in
    full precision), else in fp32, so that fp16 centroids are not rounded to a bf16 query's grid:
    the table is C * B * Lq products, microseconds either way.

    ``permuted`` (Lq <= 32): [C, B * 32] in the mma kernel's column order, column
    4 (R % 8) + R // 8 of each query holding its row R and columns past Lq zero
    (ops/residual_mma.permuted_table), read from Q3 as it is.
    """
    mixed = centroids.dtype != Q3.dtype
    C, dim = centroids.shape
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"the centroid-score table is fp32 or fp16, got {dtype}")
    if permuted:
        if Q3.shape[1] > 32:
            raise ValueError(f"a permuted table holds at most 32 query rows, got {Q3.shape[1]}")
        rows, num_rows = Q3, Q3.shape[0] * 32
        strides = (Q3.stride(1), Q3.stride(2), Q3.stride(0), Q3.shape[1])
    else:
        rows = Q3.reshape(-1, Q3.shape[-1])
        num_rows = rows.shape[0]
        strides = (rows.stride(0), rows.stride(1), 0, 0)
    out = torch.empty(C, num_rows, dtype=dtype, device=Q3.device)
    if C == 0 or num_rows == 0:
        return out
    block_r, num_warps = table_tile(num_rows)
    grid = (cdiv(C, TABLE_BLOCK_C), cdiv(num_rows, block_r))
    stride_qr, stride_qd, stride_qb, query_rows = strides
    _query_centroid_scores_kernel[grid](
        centroids, rows, out, out, out, out, out, out, C, num_rows, dim, 0.0,
        centroids.stride(0), centroids.stride(1), stride_qr, stride_qd, out.stride(0),
        stride_qb, query_rows,
        BLOCK_C=TABLE_BLOCK_C, BLOCK_R=block_r, BLOCK_D=min(MAX_BLOCK_D, max(16, pow2(dim))),
        INPUT_PRECISION=dot_precision(torch.float32 if mixed else Q3.dtype),
        UPCAST=mixed or interpreter_upcast(Q3.dtype), SPLIT_Q=False, PROBE=False,
        PERMUTE_32=permuted, num_warps=num_warps, num_stages=TABLE_NUM_STAGES,
    )
    return out


def split_query_centroid_scores(Q3: torch.Tensor, centroids: torch.Tensor
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(S, head, tail) for an fp32 Q3 [B, Lq, d] and fp16 centroids [C, d], in one launch.

    S = centroids @ Q_rows^T, [C, B * Lq] fp32, from two fp16 tensor-core products per chunk (the
    query's fp16 head and the fp16 rounding of what the head misses): as accurate as an fp32
    product, since fp16 x fp16 products are exact in fp32, and it reads the centroids in fp16.
    head, tail: [B, Lq, d] fp16 with head + tail = Q3 to ~2**-22, the operands of
    ``maxsim_residual(..., split_query=True)``.
    """
    return _split_table(Q3, centroids)[:3]


def split_query_centroid_probe(Q: torch.Tensor, centroids: torch.Tensor, threshold: float):
    """(S, head, tail, cells, keep): :func:`split_query_centroid_scores` for one query [Lq, d]
    (1 <= Lq <= SPLIT_TABLE_MAX_BLOCK_R) with stage 1's reductions of S in the same launch,
    ``cells`` [Lq] int64 and ``keep`` [C] bool as ``ops.centroid.probe_centroids(S, threshold)``
    gives them (C >= 1): candidate generation without a pass over the table."""
    if Q.dim() != 2 or not 1 <= Q.shape[0] <= SPLIT_TABLE_MAX_BLOCK_R or centroids.shape[0] == 0:
        raise ValueError(f"split_query_centroid_probe needs Q [Lq, d] with 1 <= Lq <= "
                         f"{SPLIT_TABLE_MAX_BLOCK_R} and C >= 1 centroids, got Q "
                         f"{checks.describe(Q)} and centroids {checks.describe(centroids)}")
    return _split_table(Q[None], centroids, threshold)


def _split_table(Q3, centroids, probe_threshold=None):
    if Q3.dtype != torch.float32 or centroids.dtype != torch.float16:
        raise TypeError(f"split_query_centroid_scores needs an fp32 Q and fp16 centroids, got "
                        f"Q {checks.describe(Q3)} and centroids {checks.describe(centroids)}")
    rows = Q3.reshape(-1, Q3.shape[-1])
    C, dim = centroids.shape
    out = torch.empty(C, rows.shape[0], dtype=torch.float32, device=Q3.device)
    head = torch.empty(Q3.shape, dtype=torch.float16, device=Q3.device)
    tail = torch.empty_like(head)
    if rows.shape[0] == 0:
        return out, head, tail
    block_r = min(SPLIT_TABLE_MAX_BLOCK_R, max(MIN_DOT_DIM, pow2(rows.shape[0])))
    # At least one centroid block, so that the head and tail are written even when C = 0.
    grid = (max(1, cdiv(C, SPLIT_TABLE_BLOCK_C)), cdiv(rows.shape[0], block_r))
    probe = probe_threshold is not None
    # Without the probe its outputs are never written: the table stands in for their pointers.
    keep, block_max, block_arg = out, out, out
    if probe:
        keep = torch.empty(C, dtype=torch.bool, device=Q3.device)
        block_max = torch.empty(block_r, grid[0], dtype=torch.float32, device=Q3.device)
        block_arg = torch.empty(block_r, grid[0], dtype=torch.int32, device=Q3.device)
    _query_centroid_scores_kernel[grid](
        centroids, rows, out, head, tail, keep.view(torch.int8) if probe else out,
        block_max, block_arg, C, rows.shape[0], dim, float(probe_threshold or 0.0),
        centroids.stride(0), centroids.stride(1), rows.stride(0), rows.stride(1), out.stride(0),
        0, 0, BLOCK_C=SPLIT_TABLE_BLOCK_C, BLOCK_R=block_r,
        BLOCK_D=min(MAX_BLOCK_D, max(MIN_DOT_DIM, pow2(dim))),
        INPUT_PRECISION=dot_precision(torch.float16), UPCAST=interpreter_upcast(torch.float16),
        SPLIT_Q=True, PROBE=probe, PERMUTE_32=False,
    )
    if not probe:
        return out, head, tail
    return out, head, tail, cells_from_blocks(block_max, block_arg, rows.shape[0]), keep


def centroid_table_fits(num_centroids: int, num_rows: int, element_size: int = 4) -> bool:
    """Whether one launch's [C, rows] centroid-score table of ``element_size``-byte entries (4:
    fp32, 2: fp16) fits MAX_CENTROID_TABLE_BYTES."""
    return num_centroids * num_rows * element_size <= MAX_CENTROID_TABLE_BYTES


def centroid_table_tiles(num_centroids: int, num_queries: int, query_len: int,
                         element_size: int = 4, builds: bool = False) -> tuple[int, int] | None:
    """How the table path scores ``num_queries`` queries of ``query_len`` rows against C
    centroids: ``(queries, tokens)`` per launch, each launch's [C, queries * tokens] table
    fitting :func:`centroid_table_fits`; ``(num_queries, query_len)`` is one launch. None where
    even a tile of MIN_TABLE_TILE_ROWS query rows does not fit: the centroid rows are gathered.
    At most WHOLE_TABLE_ROWS rows are one launch over the whole table wherever they would be
    split, and also where no tile fits unless the op ``builds`` the table itself and could
    gather instead (a caller's table, or split_query, which needs one).

    Whole queries first: launches over disjoint queries write disjoint rows of the scores, with
    nothing to sum. A query too wide for one table is cut into the fewest equal tiles of its
    tokens: a score is a sum of per-token maxima, so each tile is exact MaxSim over its tokens
    and the tiles' scores add up (an empty document is -inf in every tile, a tile past a query's
    length adds 0). Every launch is a pass over the documents' codes and residual rows, decoding
    each token again, hence the fewest and widest tiles the budget allows, and none narrower
    than MIN_TABLE_TILE_ROWS rows. A 96-token query's fp32 table at MS MARCO's C = 2**18
    (96 MiB) is four launches of 24 rows; a 32-token one (32 MiB) is one launch.

    The budget stays one constant rather than a share of the device's L2 size: it is under half
    of an H100's or H200's L2, and a per-device budget would only change choices that were never
    measured.
    """
    tiles = _budget_tiles(num_centroids, num_queries, query_len, element_size)
    if num_queries * query_len <= WHOLE_TABLE_ROWS and (tiles is not None or not builds):
        return num_queries, query_len
    return tiles


def _budget_tiles(num_centroids, num_queries, query_len, element_size):
    if num_queries * query_len == 0:
        return num_queries, query_len
    rows = MAX_CENTROID_TABLE_BYTES // max(1, num_centroids * element_size)
    if num_queries * query_len <= rows:
        return num_queries, query_len
    if query_len <= rows:
        return rows // query_len, query_len
    tokens = cdiv(query_len, cdiv(query_len, max(rows, 1)))
    return (1, tokens) if tokens >= MIN_TABLE_TILE_ROWS else None


# (C, rows, bytes per entry) already logged as too big for the table path, or split over launches.
_logged_no_table: set[tuple[int, int, int]] = set()
_logged_tiles: set[tuple[int, int, int]] = set()


def _use_table(cfg: ResidualConfig, inv_norms, num_centroids: int, num_queries: int,
               query_len: int, element_size: int, builds: bool, num_docs: int) -> bool:
    """Whether one launch of ``num_queries`` x ``query_len`` rows over ``num_docs`` documents
    reads a centroid-score table (``builds``: the op would build it, in fp16 where
    ``element_size`` is 2, and could gather centroid rows instead)."""
    if cfg.centroid_table is None:
        one_fp16_query = builds and element_size == 2 and num_queries == 1
        if inv_norms is None or (one_fp16_query and query_len <= WHOLE_TABLE_ROWS
                                 and num_docs < MANY_DOCS):
            return False
        whole = (num_queries, query_len)
        if centroid_table_tiles(num_centroids, num_queries, query_len, element_size,
                                builds) == whole:
            return True
        num_rows = num_queries * query_len
        key = (num_centroids, num_rows, element_size)
        if key not in _logged_no_table:
            _logged_no_table.add(key)
            logger.warning(
                "maxsim_residual: the centroid-score table [C=%d, B*Lq=%d] of %d-byte entries "
                "(%.1f MiB) is over MAX_CENTROID_TABLE_BYTES (%.1f MiB) even in tiles of %d "
                "query rows: gathering centroid rows with the pair decoder instead",
                num_centroids, num_rows, element_size,
                num_centroids * num_rows * element_size / 2**20,
                MAX_CENTROID_TABLE_BYTES / 2**20, MIN_TABLE_TILE_ROWS)
        return False
    if cfg.centroid_table and inv_norms is None:
        raise ValueError(
            "config.centroid_table=True needs inv_norms (codecs.residual_inverse_norms): the "
            "table gives <q, centroid> but not the norm of centroid + residual"
        )
    return cfg.centroid_table


def _half_table(Q3, inv_norms, config, centroid_scores, split_query) -> bool:
    """Whether the kernel builds its centroid-score table in fp16: config.half_table, by default
    for fp16 queries where it builds the table (no caller's table, no split_query)."""
    if config is not None and config.half_table is not None:
        return config.half_table
    return (centroid_scores is None and not split_query and Q3.dtype == torch.float16
            and inv_norms is not None)


def _table_entry_bytes(centroid_scores, half_table: bool) -> int:
    """The bytes of one table entry: the table is judged in the dtype it is used in."""
    if centroid_scores is not None:
        return centroid_scores.element_size()
    return 2 if half_table else 4


def _launch(Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids, inv_norms,
            query_lengths, num_out_docs, config, centroid_scores=None, split_query=False,
            applies: bool = False):
    """``applies``: config is the op's own mma default, chosen where the mma kernel applies (its
    fields and the input need no second check)."""
    if config is not None and config.scoring == "mma":
        if not applies:
            check_config(config)
            residual_mma.check_applies(Q3, codes, residuals, nbits, inv_norms, centroids,
                                       split_query, centroid_scores)
        return residual_mma.launch_residual_mma(
            Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids, inv_norms,
            query_lengths, num_out_docs, centroid_scores, config.half_table,
            config.docs_per_program, config.prefetch)
    if Q3.shape[1] > MAX_LQ_PER_LAUNCH:
        centroid_scores = None  # each chunk of query tokens builds its own table

    def launch(Q_chunk, chunk_lengths):
        return _launch_table_tiles(Q_chunk, codes, residuals, offsets, centroids, bucket_weights,
                                   nbits, pids, inv_norms, chunk_lengths, num_out_docs, config,
                                   centroid_scores, split_query)

    return launch_in_query_chunks(Q3, query_lengths, num_out_docs, launch, config, check_config)


def _launch_table_tiles(Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids,
                        inv_norms, query_lengths, num_out_docs, config, centroid_scores,
                        split_query):
    """One launch, or one per tile of query rows where the table path's table is split
    (:func:`centroid_table_tiles`); the tiles' scores make up the whole."""
    B, Lq, _ = Q3.shape
    C = centroids.shape[0]
    index = (codes, residuals, offsets, centroids, bucket_weights, nbits, pids, inv_norms)
    tiles = None
    if inv_norms is not None and (config is None or config.centroid_table is None):
        entry_bytes = _table_entry_bytes(
            centroid_scores, _half_table(Q3, inv_norms, config, centroid_scores, split_query))
        tiles = centroid_table_tiles(C, B, Lq, entry_bytes,
                                     builds=centroid_scores is None and not split_query)
    if tiles is None or tiles == (B, Lq):
        return _launch_kernel(Q3, *index, query_lengths, num_out_docs, config, centroid_scores,
                              split_query)
    queries, tokens = tiles
    key = (C, B * Lq, entry_bytes)
    if key not in _logged_tiles:
        _logged_tiles.add(key)
        logger.info(
            "maxsim_residual: the centroid-score table [C=%d, B*Lq=%d] of %d-byte entries "
            "(%.1f MiB) is over MAX_CENTROID_TABLE_BYTES (%.1f MiB): %d launches of %d x %d "
            "query rows, one table each", C, B * Lq, entry_bytes, C * B * Lq * entry_bytes / 2**20,
            MAX_CENTROID_TABLE_BYTES / 2**20, cdiv(B, queries) * cdiv(Lq, tokens),
            queries, tokens)
    summed = tokens < Lq
    out = (torch.zeros if summed else torch.empty)(B, num_out_docs, dtype=torch.float32,
                                                   device=Q3.device)
    # [C, B, Lq]: column b * Lq + i of the table is query b's token i (Q3.reshape(-1, d)).
    table = None if centroid_scores is None else centroid_scores.view(C, B, Lq)
    for b in range(0, B, queries):
        for t in range(0, Lq, tokens):
            Q_tile = Q3[b:b + queries, t:t + tokens]
            tile_lengths = None
            if query_lengths is not None:
                tile_lengths = (query_lengths[b:b + queries] - t).clamp(0, Q_tile.shape[1])
            # Copied into a dense [C, rows] table: gathered from the caller's wider rows, a tile
            # would spread over the cache lines of the whole table.
            tile_table = None if table is None else (
                table[:, b:b + queries, t:t + tokens].reshape(C, -1).contiguous())
            scores = _launch_kernel(Q_tile, *index, tile_lengths, num_out_docs, config,
                                    tile_table, split_query)
            if summed:
                out[b:b + queries] += scores
            else:
                out[b:b + queries] = scores
    return out


def _launch_kernel(Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids,
                   inv_norms, query_lengths, num_out_docs, config, centroid_scores=None,
                   split_query=False):
    B, Lq, dim = Q3.shape
    out = torch.empty(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    # The table path needs inverse norms; only there does the table's dtype (and the prefetch
    # that pays beside an fp16 table) matter.
    builds_table = centroid_scores is None and not split_query
    half_default = _half_table(Q3, inv_norms, None, centroid_scores, split_query)
    cfg = config or default_residual_config(B, Lq, split_query, num_out_docs, Q3.element_size(),
                                            half_default, nbits)
    half_table = _half_table(Q3, inv_norms, cfg, centroid_scores, split_query)
    table_bytes = _table_entry_bytes(centroid_scores, half_table)
    if config is None and cfg.decode == "permute" and not (
            _permute_applies(Q3, residuals, nbits, split_query, cfg.block_d or default_block_d(dim))
            and _use_table(cfg, inv_norms, centroids.shape[0], B, Lq, table_bytes,
                           builds_table, num_out_docs)):
        # The default falls back to the pair table where permutes cannot serve (an explicit
        # decode="permute" is refused there) and on the centroid-gather path: its centroid rows
        # would be read in the permuted column order, 2-byte gathers instead of row loads.
        cfg = dataclasses.replace(cfg, decode="pairs", pipeline_codes=False)
    if half_table and (Q3.dtype != torch.float16 or not builds_table):
        raise ValueError("config.half_table needs fp16 queries and a table built here (no "
                         f"centroid_scores, no split_query); got {Q3.dtype} queries")
    block_d = cfg.block_d or default_block_d(dim)
    if cfg.decode == "permute" and not _permute_applies(Q3, residuals, nbits, split_query,
                                                        block_d):
        raise ValueError("config.decode='permute' needs nbits = 2 or 4, 16-bit products "
                         "(fp16/bf16 queries or split_query) and 4-byte aligned residual rows; got "
                         f"nbits={nbits}, {Q3.dtype} queries, residual row stride "
                         f"{residuals.stride(0)}")
    lq = pow2(Lq)
    queries_per_block = max(cfg.queries_per_block, cdiv(MIN_DOT_DIM, lq))
    num_qblocks = cdiv(B, queries_per_block)
    use_table = _use_table(cfg, inv_norms, centroids.shape[0], B, Lq, table_bytes, builds_table,
                           num_out_docs)
    scores_table = None
    Q_lo = None
    if use_table and centroid_scores is not None:
        scores_table = centroid_scores
    elif use_table and split_query and centroids.dtype == torch.float16:
        # One launch builds the table and the query's fp16 head and tail.
        scores_table, Q3, Q_lo = split_query_centroid_scores(Q3, centroids)
    elif use_table:
        scores_table = query_centroid_scores(
            Q3, centroids, torch.float16 if half_table else torch.float32)
    for name, rows in (("centroids", centroids), ("centroid score table", scores_table)):
        if rows is not None and sum((n - 1) * st for n, st in zip(rows.shape, rows.stride())
                                    if n) > MAX_INT32_OFFSET:
            raise ValueError(f"{name} {checks.describe(rows)}: too large for the kernel's int32 "
                             f"element offsets (code * row stride + column)")
    if split_query and not use_table:
        raise ValueError("split_query needs the centroid-table path: config.centroid_table=False "
                         "was given, or the table does not fit even in tiles of query rows "
                         "(centroid_table_tiles)")
    if split_query and Q_lo is None:
        # The table above was built from the fp32 query; the tiles see its fp16 head and tail.
        # Contiguous, so that the two share the strides the kernel is given for both.
        Q_head = Q3.to(torch.float16).contiguous()
        Q_lo = (Q3 - Q_head.float()).to(torch.float16).contiguous()
        Q3 = Q_head
    unit_bytes = _unit_bytes(residuals, block_d, nbits)
    # On the GPU (triton 3.6) the pair decoder over byte units gives wrong scores in 16-column
    # chunks (word units and 128-column chunks are right); byte-unit chunks narrower than
    # MAX_BLOCK_D decode with the select tree, which is right at every width (see
    # results/compressed/h200-diag).
    group = DECODERS[cfg.decode]
    if unit_bytes == 1 and block_d < MAX_BLOCK_D:
        group = 1
    if group == DECODERS["permute"]:  # the kernel lays the weights out itself
        table = checks.unit_stride(bucket_weights)
    else:
        table = checks.derived(bucket_weights, ("decode table", nbits, Q3.dtype, group),
                               lambda: decode_table(bucket_weights, nbits, Q3.dtype, group))
    dummy = out  # pointer arguments behind a False constexpr are never read
    num_chunks = cdiv(num_out_docs, cfg.docs_per_program)
    grid, counter = document_grid(cfg, num_chunks, num_qblocks, queries_per_block, B, Q3.device)
    _maxsim_residual_kernel[(grid,)](
        Q3, Q_lo if Q_lo is not None else Q3, codes, residuals, offsets,
        pids if pids is not None else dummy,
        centroids, table,
        inv_norms if inv_norms is not None else dummy,
        scores_table if use_table else dummy,
        query_lengths if query_lengths is not None else dummy,
        out, counter if counter is not None else dummy,
        num_out_docs, B, Lq, dim, residuals.shape[1] // unit_bytes, num_qblocks, num_chunks,
        Q3.stride(0), Q3.stride(1), Q3.stride(2), residuals.stride(0) // unit_bytes,
        centroids.stride(0), centroids.stride(1),
        scores_table.stride(0) if use_table else 0, centroids.shape[0] - 1,
        out.stride(0), out.stride(1),
        NBITS=nbits, UNIT_BYTES=unit_bytes, DECODE_GROUP=group,
        ELEM_BITS=8 * Q3.element_size(), LQ=lq, QUERIES_PER_BLOCK=queries_per_block,
        BLOCK_T=cfg.block_t, BLOCK_T_TAIL=cfg.block_t_tail, BLOCK_D=block_d,
        NUM_D_BLOCKS=cdiv(dim, block_d), DOCS_PER_PROGRAM=cfg.docs_per_program,
        HAS_PIDS=pids is not None, HAS_QUERY_LENGTHS=query_lengths is not None,
        CENTROID_TABLE=use_table, PRECOMPUTED_NORMS=inv_norms is not None,
        SPLIT_Q=split_query, INPUT_PRECISION=dot_precision(Q3.dtype), UPCAST=interpreter_upcast(Q3.dtype),
        EVEN_D=dim % block_d == 0, PTX_LOADS=_ptx_loads(cfg),
        PERSISTENT=cfg.persistent,
        PREFETCH=0 if interpreting() else int(cfg.prefetch), PIPELINE_CODES=cfg.pipeline_codes,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
    )
    return out


def check_residual_index(Q, codes, residuals, offsets, centroids, bucket_weights, nbits,
                         inv_norms=None) -> None:
    """Shape/dtype/device checks shared by the residual scorers (no host sync)."""
    checks.check_query(Q)
    if nbits not in SUPPORTED_NBITS:
        raise ValueError(f"nbits must be one of {SUPPORTED_NBITS}, got {nbits!r}")
    dim = Q.shape[-1]
    checks.check_tensor("codes", codes, dims=(1,), dtypes=checks.INDEX_DTYPES, device=Q.device)
    checks.check_tensor("residuals", residuals, dims=(2,), dtypes=(torch.uint8,), device=Q.device)
    checks.check_tensor("centroids", centroids, dims=(2,), dtypes=checks.FLOAT_DTYPES,
                        device=Q.device)
    checks.check_same_dim("centroids", centroids, Q)
    checks.check_tensor("bucket_weights", bucket_weights, dims=(1,), dtypes=checks.FLOAT_DTYPES,
                        device=Q.device)
    checks.check_tensor("offsets", offsets, dims=(1,), dtypes=(torch.int64,), device=Q.device)
    if dim % 8:
        raise ValueError(f"Q's embedding dimension must be a multiple of 8 for residual codes, got {dim}")
    if bucket_weights.numel() != 1 << nbits:
        raise ValueError(
            f"bucket_weights must have 2**nbits = {1 << nbits} entries, got "
            f"{checks.describe(bucket_weights)}"
        )
    if residuals.shape[0] != codes.shape[0] or residuals.shape[1] != dim * nbits // 8:
        raise ValueError(
            f"residuals must be [T={codes.shape[0]}, d*nbits/8={dim * nbits // 8}] for d={dim}, "
            f"nbits={nbits}; got {checks.describe(residuals)}"
        )
    if offsets.numel() < 1:
        raise ValueError("offsets must have N+1 >= 1 entries (offsets[0] = 0)")
    if inv_norms is not None:
        checks.check_tensor("inv_norms", inv_norms, dims=(1,), dtypes=checks.FLOAT_DTYPES,
                            device=Q.device)
        if inv_norms.shape[0] != codes.shape[0]:
            raise ValueError(
                f"inv_norms must have one entry per token (T={codes.shape[0]}), got "
                f"{checks.describe(inv_norms)}"
            )


@scoring_op
@checks.rerun_if_stale
def maxsim_residual(
    Q: torch.Tensor,
    codes: torch.Tensor,
    residuals: torch.Tensor,
    offsets: torch.Tensor,
    centroids: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
    pids: torch.Tensor | None = None,
    *,
    inv_norms: torch.Tensor | None = None,
    query_lengths: torch.Tensor | None = None,
    centroid_scores: torch.Tensor | None = None,
    split_query: bool = False,
    config: ResidualConfig | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Exact MaxSim straight from PLAID residual codes (colbert-ai's bit layout).

        score[b, n] = sum_i max_t <Q[b, i], normalize(centroids[codes[t]] + bucket_weights[bucket_t])>

    Decompressed embeddings are never written to memory: each [tokens, d] tile is decoded in
    registers and fed to the tensor cores.

    Args:
        Q: [B, Lq, d] or [Lq, d], fp16 / bf16 / fp32 (the dtype of the tensor-core products).
        codes: int32/int64 [T] centroid id per token.
        residuals: uint8 [T, d * nbits / 8]; any row stride (rows starting 4-byte aligned are
            read as 32-bit words, others as bytes); copied once if a row is not contiguous.
        offsets: int64 [N+1]; document n owns tokens ``offsets[n]:offsets[n+1]``.
        centroids: [C, d] float (colbert-ai keeps them fp16 on the GPU).
        bucket_weights: [2**nbits] float.
        nbits: 1, 2 or 4.
        pids: optional int32/int64 [M]: score only these documents, in this order, read in
            place (no gather of codes into a new tensor). Default: all N.
        inv_norms: optional float [T], ``codecs.residual_inverse_norms`` of this index,
            computed once at index load (4 bytes per token). With it the centroid part of the
            score comes from a per-batch [C, B*Lq] table and centroid rows are never read; without
            it the kernel gathers centroid rows and takes the norm of each decoded token.
        query_lengths: optional int32/int64 [B] (3-D Q only); padded query tokens add nothing.
        centroid_scores: optional fp32 [C, B*Lq], ``centroids @ Q_rows^T`` (what
            :func:`query_centroid_scores` builds), when the caller already has it: PLAID's
            candidate generation computes exactly this table, so the plugin's stage 4 reuses it
            instead of building it again. Used only with ``inv_norms`` (the table path). An
            fp16 table is taken with fp16 queries: half the bytes gathered per token, and each
            entry's rounding (2**-11 relative) is that of colbert-ai's fp16 score matrix.
        split_query: fp32 Q only, with ``inv_norms``: multiply the fp16-decoded residual weights
            by Q's fp16 head and tail (two fp16 tensor-core products) instead of three tf32
            products on an fp32 tile; about 3x faster. The centroid part stays exact fp32; the
            residual weights' rounding to fp16 leaves about 1e-5 per score (tf32x3: about 1e-6),
            nothing when they are fp16 values (colbert-ai's GPU codec): then about 2e-6.
        config: a fixed :class:`ResidualConfig`; None: :func:`mma_default` where scoring="mma"
            applies at an nbits of MMA_NBITS and at least MANY_DOCS documents are scored, else
            :func:`default_residual_config`'s launch of the Triton kernel.
        validate: check values (offsets, pids, codes, query_lengths in range; no NaN or inf in
            centroids, bucket_weights or inv_norms; Q and centroid_scores are not read) with
            one host sync per call, none when every checked tensor was checked before unchanged
            (same object and version: an index's offsets and codes are read once). A new
            offsets, pids, query_lengths or codes is judged after the launch, which reads it
            clamped into range (codes are clamped by the kernel as it reads them; a document
            whose end is before its start is empty).

    Q, centroids and the residual rows are read through their strides; a strided view of a 1-D
    tensor (offsets, pids, codes, inv_norms, query_lengths) is copied once, as is a
    ``centroid_scores`` whose rows are not contiguous.

    Returns:
        fp32 [B, M] (or [M] for a 2-D Q), M = len(pids) or N. An empty document scores -inf,
        an empty query 0. A NaN in Q, a centroid, a bucket weight, an inverse norm or a
        centroid_scores entry makes exactly the scores it touches NaN, as in torch; inf as torch
        gives it, except where the centroid-score table adds <q, c> + <q, r> (docs/kernels.md,
        NaN and inf).
    """
    check_residual_index(Q, codes, residuals, offsets, centroids, bucket_weights, nbits, inv_norms)
    num_docs = offsets.numel() - 1
    checks.pids_shape(pids, Q.device)
    checks.query_lengths_shape(query_lengths, Q)
    batch = checks.DataChecks(provisional=True)
    if validate:
        checks.add_query_lengths(batch, query_lengths, Q, defer=True)
        # The launch takes none of the offsets' statistics: a new one waits until after it.
        batch.offsets(offsets, codes.shape[0], defer=True)
        batch.in_range("pids", pids, 0, num_docs, defer=True)
        batch.in_range("codes", codes, 0, centroids.shape[0], f"[0, C={centroids.shape[0]})",
                       defer=True, launch_clamps=True)
        for name, t in (("centroids", centroids), ("bucket_weights", bucket_weights),
                        ("inv_norms", inv_norms)):
            if t is not None:
                batch.finite(name, t)
        batch.run()
        pids, query_lengths = batch.safe("pids", pids), batch.safe("query_lengths", query_lengths)
        offsets = batch.safe("offsets", offsets)
    # The kernel reads Q, centroids and residual rows through their strides (rows read whole
    # need stride 1 within a row); the 1-D tensors by element.
    offsets, pids, codes = checks.unit_stride(offsets), checks.unit_stride(pids), checks.unit_stride(codes)
    inv_norms, query_lengths = checks.unit_stride(inv_norms), checks.unit_stride(query_lengths)
    if residuals.stride(1) != 1:
        residuals = residuals.contiguous()
    Q3 = Q[None] if Q.dim() == 2 else Q
    if split_query and (Q.dtype != torch.float32 or inv_norms is None):
        raise ValueError(
            f"split_query needs an fp32 Q and inv_norms (the centroid-table path), got Q "
            f"{Q.dtype} and inv_norms {'given' if inv_norms is not None else 'None'}"
        )
    if centroid_scores is not None:
        rows = Q3.shape[0] * Q3.shape[1]
        checks.check_tensor("centroid_scores", centroid_scores, dims=(2,),
                            dtypes=(torch.float32, torch.float16), device=Q.device)
        if centroid_scores.dtype == torch.float16 and Q.dtype != torch.float16:
            raise ValueError(f"an fp16 centroid_scores table goes with fp16 queries only, got Q {Q.dtype}")
        if tuple(centroid_scores.shape) != (centroids.shape[0], rows):
            raise ValueError(
                f"centroid_scores must be [C={centroids.shape[0]}, B*Lq={rows}] "
                f"(centroids @ Q_rows^T), got {checks.describe(centroid_scores)}"
            )
        if centroid_scores.stride(1) != 1:
            centroid_scores = centroid_scores.contiguous()  # its rows are gathered whole
    num_out = pids.numel() if pids is not None else num_docs
    applies = (config is None and nbits in MMA_NBITS and num_out >= MANY_DOCS
               and nvrtc.available()
               and not residual_mma.reasons_not_to_apply(Q3, codes, residuals, nbits, inv_norms,
                                                         centroids, split_query, centroid_scores))
    if applies:
        config = mma_default(residual_mma.takes_l2_hints(Q3, centroids, centroid_scores))
    out = _launch(Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids, inv_norms,
                  query_lengths, num_out, config, centroid_scores, split_query, applies)
    batch.finish()
    return out[0] if Q.dim() == 2 else out
