"""Host side of the dense TileMaxSim kernel: check inputs, allocate the output, pick a config, launch."""

from __future__ import annotations

import dataclasses

import torch

from tilemaxsim_plaid.kernels.maxsim_dense import (_maxsim_dense_kernel, _maxsim_packed_flat_kernel,
                                                   _maxsim_packed_slots_kernel)
from tilemaxsim_plaid.ops import checks
from tilemaxsim_plaid.ops.launch import (MAX_LQ_PER_LAUNCH, cdiv, dot_precision, interpreter_upcast,
                                         launch_in_query_chunks, memory_bandwidth, pow2,
                                         scoring_op)

__all__ = ["MaxSimConfig", "default_config", "default_query_chunks", "maxsim_padded",
           "maxsim_packed", "tail_joins_head"]

# 128 columns of the embedding per chunk: one 256-byte fp16 row segment per token, a full
# tensor-core K tile, and d = 384 / 768 split into 3 / 6 chunks with no padding in memory.
# 256-column chunks read no faster at d = 256 / 512
# (results/dense_variants/h100-81f0854-whole-rows).
MAX_BLOCK_D = 128
# tl.dot needs every dimension >= 16.
MIN_DOT_DIM = 16
# From this many documents on, one query is scored by programs that hold the query across
# several documents each (default_config): 4,096 programs of 4 documents and more, ~31 per SM
# of an H200 (d = 256, 28k long documents: results/sweep_configs/h200-e5fc4ca-fifth).
MANY_DOCS = 16384
# Query rows of one tensor-core product where several queries fill it (4 queries of 32 tokens).
FULL_QUERY_BLOCK_ROWS = 128
# Padded documents up to this long, one query: the query held in one warp across 16 of them.
HELD_PADDED_MAX_LEN = 64
# One query over packed documents of this many bytes on average or more, on a card that reads
# DRAM slower than PER_DOCUMENT_MAX_BANDWIDTH bytes/s (an H100's 3.35 TB/s, not an H200's 4.8):
# per-document tiles instead of the held query (results/dense_variants/h100-87a8fc5-per-document).
# At d in whole 128-column chunks past one, documents of WIDE_PER_DOCUMENT_MIN_TOKENS or more on
# average (two 64-token tiles) take 64-token tiles over those chunks instead of the held or the
# 64-column streamed ones (results/dense_variants/h100-84f9d89-wide-per-document; the figures
# are in docs/kernels.md).
PER_DOCUMENT_MIN_BYTES, PER_DOCUMENT_MAX_BANDWIDTH = 16384, 4.0e12
WIDE_PER_DOCUMENT_MIN_TOKENS = 128


@dataclasses.dataclass(frozen=True)
class MaxSimConfig:
    """One fixed launch configuration. Passing one skips the shape heuristics, so a launch is
    reproducible and can be captured in a CUDA graph; what follows from the config and the
    input's dimensions alone (rows past a document's end repeated, documents walked as one loop:
    _repeat_rows, _flat_documents) is still decided, the same way for the same shapes.

    Attributes:
        block_t: document tokens per tile.
        queries_per_block: queries stacked into one tensor-core product.
        q_blocks_per_program: query blocks that reuse one document tile inside a program.
        docs_per_program: documents one program walks (amortises loading the query block).
        single_tile: every document fits one tile (requires max doc length <= block_t and d <=
            128): the tile is read once and reused by all query blocks of the program.
        slots: packed layout only: docs_per_program documents side by side in one tile of
            docs_per_program x block_t rows (short documents share one tensor-core product).
        length_order: slots only: the tiles take the documents in order of length (an argsort
            of the scored documents' lengths, remembered per offsets tensor when every document
            is scored), so a tile's documents end together; a tile otherwise runs to its
            longest document.
        hold_query: tiled per-document path with one query block per program: load the query
            block once per program, one register tile per chunk of d (at most MAX_HELD_CHUNKS),
            and hold it across all tiles and documents.
        running_max: tiled per-document path: a document's whole tiles are read without masks
            into an elementwise running max, reduced over tokens once per document, and only
            its last partial tile is masked (otherwise every tile is masked and reduced);
            pays in one-warp programs over documents of whole tiles.
        num_warps, num_stages: Triton launch parameters.
        block_d: embedding columns per chunk, a power of two in [MIN_DOT_DIM, MAX_BLOCK_D], or
            None for the default (one chunk up to d = 128, masked when d is not a power of two;
            128-wide chunks above). Where d is past its whole chunks by a power of two >= 16,
            the tiled paths take that remainder as a narrower last chunk (d = 144 in chunks of
            128 as 128 + 16); otherwise the last chunk is masked past d (the slots path always
            masks it). A narrower chunk that divides d masks no column (d = 96 as 3 x 32,
            d = 144 as 9 x 16) at the cost of more, smaller products; single_tile needs d in
            one chunk.
    """

    block_t: int = 64
    queries_per_block: int = 1
    q_blocks_per_program: int = 1
    docs_per_program: int = 1
    single_tile: bool = False
    num_warps: int = 4
    num_stages: int = 2
    slots: bool = False
    hold_query: bool = False
    block_d: int | None = None
    running_max: bool = False
    length_order: bool = False


# Chunks of d a held query may span (hold_query): each is its own register tile and its own
# unrolled product per document tile.
MAX_HELD_CHUNKS = 16
# A held query at a d that 32-column chunks pad less than a power of two is held in chunks
# (_held_chunk: 32 or 64 columns where they divide d, else the widest with a remainder chunk), up
# to HELD_CHUNKED_MAX_DIM: one warp holds a 32-row block of 192 fp16 columns in 96 registers a
# thread (d = 96, 144 and 192 measured). A query of up to 32
# tokens is also held at d = 256 in 64-column chunks, in one warp (127 registers, no spill;
# results/sweep_configs/h200-34d0588-third). Wider d keeps the streamed chunks.
HELD_CHUNK_COLUMNS, HELD_CHUNKED_MAX_DIM, HELD_ONE_WARP_MAX_DIM = 32, 192, 256
# One query repeats the rows past a document's end (_repeat_rows) up to this d.
REPEAT_ROWS_MAX_DIM = 64
# One query's documents walked as one loop (_flat_documents) where they average at most this
# many tokens: 1.09-1.12x at lognormal-30 (mean 30) for d = 64 / 96 / 128, even at mean 70
# (results/dense_variants/h200-e0a5934-rows).
FLAT_MAX_MEAN_TOKENS = 48



def _block_d(dim: int) -> int:
    return min(MAX_BLOCK_D, max(MIN_DOT_DIM, pow2(dim)))


def _remainder_chunk(dim: int, block_d: int) -> int:
    """Columns of d's last chunk where the tiled kernels take it as a chunk of its own (their
    REM_D): d past its whole chunks of block_d by a power of two >= MIN_DOT_DIM (d = 144 as
    128 + 16, d = 96 as 64 + 32), so no column is masked; else 0 (the last chunk is masked past
    d, and the chunk count is the same)."""
    rem = dim % block_d
    return rem if dim > block_d and rem >= MIN_DOT_DIM and rem & (rem - 1) == 0 else 0


def _widest_chunk(dim: int) -> int | None:
    """The widest power of two from MAX_BLOCK_D down to MIN_DOT_DIM below d that divides d or
    leaves a remainder chunk (_remainder_chunk); None where none does."""
    width = MAX_BLOCK_D
    while width >= MIN_DOT_DIM:
        if width < dim and (dim % width == 0 or _remainder_chunk(dim, width)):
            return width
        width //= 2
    return None


def _held_chunk(dim: int, one_warp: bool) -> int:
    """Columns per chunk of one query held over chunks of d (default_config): 64 where 64
    divides d (d = 192, 256); a 64-row block (4 warps) in HELD_CHUNK_COLUMNS where they divide
    d (d = 96 as 3 x 32); else the widest power of two up to 128 below d that leaves a remainder
    chunk (one warp: d = 80 and 96 as 64 + 16 / 32, 144 and 160 as 128 + 16 / 32, 1.02-1.05x;
    a 64-row block: d = 144 as 128 + 16 against 4 x 32 + 16, 1.03-1.04x, where 64 + 32 at d = 96
    and 128 + 64 at d = 192 lose 1-2 %: results/dense_variants/h100-44456c4-held-block); else
    HELD_CHUNK_COLUMNS."""
    if dim % (2 * HELD_CHUNK_COLUMNS) == 0:
        return 2 * HELD_CHUNK_COLUMNS
    if not one_warp and dim % HELD_CHUNK_COLUMNS == 0:
        return HELD_CHUNK_COLUMNS
    return max(_widest_chunk(dim) or 0, HELD_CHUNK_COLUMNS)


def _wide_chunk(dim: int) -> int:
    """Columns per chunk of d > 128 on the one-query tiled path: 64 where 64 divides d (d = 384 /
    768 in six / twelve pipelined chunks), else the largest power of two >= 16 dividing d (d = 144
    as 9 x 16: no masked column), else the default 128-wide chunks (d not a multiple of 16)."""
    chunk = min(64, dim & -dim)
    return chunk if chunk >= MIN_DOT_DIM else MAX_BLOCK_D


def default_config(num_queries: int, Lq: int, max_doc_len: int | None, dim: int,
                   variable_lengths: bool = False, num_docs: int = 0,
                   element_size: int = 2, joins_tail: bool = False,
                   mean_tokens: float | None = None,
                   read_bandwidth: float | None = None) -> MaxSimConfig:
    """Deterministic heuristic (no autotuning at call time), read off the launch-config sweep of
    ``python -m experiments.sweep_configs`` over the shape grid on an H200 (see
    results/PERFORMANCE_LOG.md, runs 18, 90, 92, 99, 102, 104, 105, 107, 108, 111 and 116).

    Args:
        num_queries: B.
        Lq: query tokens (after chunking, <= MAX_LQ_PER_LAUNCH).
        max_doc_len: longest document, or None when unknown (then no single-tile path).
        dim: embedding dimension.
        variable_lengths: documents have varied lengths (PLAID's packed layout).
        num_docs: documents scored (0 when unknown).
        element_size: bytes per input element (fp32 inputs keep the per-document default: a
            held fp32 query tile would take twice the registers of the fp16 one timed below).
        joins_tail: the launch of a split query's head that may hold its tail beside it
            (:func:`tail_joins_head`): the held query block where several queries fill one, as
            only it holds a tail.
        mean_tokens: packed documents' average length in rows, when known.
        read_bandwidth: the card's peak DRAM bytes per second (launch.memory_bandwidth), when
            known; with mean_tokens it decides one query's held or per-document tiles.
    """
    if num_queries == 1:
        return _one_query_config(Lq, max_doc_len, dim, variable_lengths, num_docs, element_size,
                                 mean_tokens, read_bandwidth)
    return _several_queries_config(num_queries, Lq, max_doc_len, dim, variable_lengths, num_docs,
                                   element_size, joins_tail)


def _one_query_config(Lq: int, max_doc_len: int | None, dim: int, variable_lengths: bool,
                      num_docs: int, element_size: int, mean_tokens: float | None,
                      read_bandwidth: float | None) -> MaxSimConfig:
    """default_config for one query, which the read bounds: the query held across documents
    where there are many, per-document tiles where the card or the documents favour them."""
    wide_query = pow2(Lq) > 32
    # Packed documents at a d that 32-column chunks pad less than a power of two does (d = 96,
    # 144, 192) hold the query in chunks of 64 columns where they divide d, else in the
    # widest chunks that leave a remainder chunk, except a 64-row block where 32-column
    # chunks divide d (_held_chunk): one 128-wide chunk multiplies 32 masked columns at
    # d = 96, and 16-column chunks make d = 144 nine small products a tile. Where d fits
    # one chunk, a query of up to 16 tokens keeps it: its smaller products gain less from
    # the columns than they lose to the chunk count (runs 99, 102, 104, 107 and 108). A
    # 32-row block is also held at d = 256, one warp over 64-column chunks
    # (HELD_ONE_WARP_MAX_DIM).
    pads_less = cdiv(dim, HELD_CHUNK_COLUMNS) * HELD_CHUNK_COLUMNS < pow2(dim)
    chunked = variable_lengths and (
        (pads_less and (pow2(Lq) >= 32 or dim > MAX_BLOCK_D) and dim <= HELD_CHUNKED_MAX_DIM)
        or (not wide_query and MAX_BLOCK_D < dim <= HELD_ONE_WARP_MAX_DIM
            and dim % (2 * HELD_CHUNK_COLUMNS) == 0))
    holds = num_docs >= MANY_DOCS and element_size == 2 and (dim <= MAX_BLOCK_D or chunked)
    # Long documents on a card of less bandwidth: per-document tiles (below) read faster
    # than the held query there, and slower on a faster card; where d is whole 128-column
    # chunks past one, 64-token tiles in those chunks, for documents that fill two.
    whole_chunks = dim > MAX_BLOCK_D and dim % MAX_BLOCK_D == 0
    per_document = (
        variable_lengths and not wide_query and element_size == 2
        and read_bandwidth is not None and read_bandwidth < PER_DOCUMENT_MAX_BANDWIDTH
        and mean_tokens is not None
        and ((whole_chunks and mean_tokens >= WIDE_PER_DOCUMENT_MIN_TOKENS)
             or (dim <= MAX_BLOCK_D and not chunked
                 and mean_tokens * dim * element_size >= PER_DOCUMENT_MIN_BYTES)))
    if per_document:
        holds = False
    if (holds and not (variable_lengths or wide_query) and max_doc_len is not None
            and max_doc_len <= HELD_PADDED_MAX_LEN):
        # Short padded documents: reloading the query per document is as many bytes from
        # L2 as the document is from HBM. One warp holds it across 16 of them; tiles of up to
        # 32 tokens into a running max (a length of whole tiles masks none).
        return MaxSimConfig(block_t=max(MIN_DOT_DIM, min(32, pow2(max_doc_len))),
                            num_warps=1, num_stages=3, docs_per_program=16,
                            hold_query=True, running_max=True)
    if holds and (variable_lengths or wide_query):
        # Many documents: programs that hold the query across several documents. Reloading
        # the query block from L2 for every document costs about a tenth of the read roof at
        # MS MARCO-like lengths. A 32-row query block (packed documents): one warp, 16-token
        # tiles, 4 documents a program (16 leave long documents' last programs running
        # alone). A block of 64 rows and more (packed or padded): 4 warps of 32-token tiles,
        # 8 documents (one warp would need 128 registers per thread for the held query alone).
        block_d = _held_chunk(dim, one_warp=not wide_query) if chunked else None
        if wide_query:
            return MaxSimConfig(block_t=32, num_warps=4, num_stages=3, docs_per_program=8,
                                hold_query=True, block_d=block_d)
        return MaxSimConfig(block_t=16, num_warps=1, num_stages=3, docs_per_program=4,
                            hold_query=True, block_d=block_d)
    # One query is memory-bound: plain per-document tiles, each program one document.
    # Varied short documents (MS MARCO averages ~70 tokens) do best with 32-token tiles and
    # small (2-warp) programs, many resident per SM to keep loads in flight; full-length
    # documents stream best in 128-token tiles. Two stages rather than three at d <= 128:
    # 16 KB of shared memory per program instead of 24 lets 13 programs share an SM instead
    # of 9. Wide d pipelines its chunks in three stages; chunks narrower than 64 columns
    # make a small product per load, and a 64-row query block a large one per tile: both
    # take 64-token tiles of 4 warps.
    if variable_lengths or max_doc_len is None:
        if dim <= MAX_BLOCK_D:
            return MaxSimConfig(block_t=32, num_warps=2, num_stages=2)
        if per_document:
            return MaxSimConfig(block_t=64, num_warps=4, num_stages=3, block_d=MAX_BLOCK_D)
        chunk = _wide_chunk(dim)
        if chunk < 64 or wide_query:
            return MaxSimConfig(block_t=64, num_warps=4, num_stages=3, block_d=chunk)
        return MaxSimConfig(block_t=32, num_warps=2, num_stages=3, block_d=chunk)
    if max_doc_len > 128 and max_doc_len % 128 and dim <= MAX_BLOCK_D:
        # Padded documents that 128-token tiles would end in a mostly masked tile (180
        # tokens) stream as varied ones do.
        return MaxSimConfig(block_t=32, num_warps=2, num_stages=2)
    block_t = min(128, max(MIN_DOT_DIM, pow2(max_doc_len)))
    return MaxSimConfig(block_t=block_t, num_warps=4, num_stages=3 if dim > MAX_BLOCK_D else 2)


def _several_queries_config(num_queries: int, Lq: int, max_doc_len: int | None, dim: int,
                            variable_lengths: bool, num_docs: int, element_size: int,
                            joins_tail: bool) -> MaxSimConfig:
    """default_config for several queries, which the tensor cores bound: query blocks of up to
    FULL_QUERY_BLOCK_ROWS rows (4 queries of 32 tokens) to a product, sharing each document
    tile."""
    queries_per_block = max(1, min(pow2(num_queries), FULL_QUERY_BLOCK_ROWS // pow2(Lq)))
    num_qblocks = cdiv(num_queries, queries_per_block)
    if (max_doc_len is not None and max_doc_len <= 128 and dim <= MAX_BLOCK_D
            and (num_qblocks > 1 or variable_lengths)):
        # Cross-query tiling: the document tile is read once and reused by up to 8 query blocks
        # (padded documents with one query block have nothing to share: 64-token tiles below
        # are faster).
        return MaxSimConfig(block_t=max(MIN_DOT_DIM, pow2(max_doc_len)),
                            queries_per_block=queries_per_block,
                            q_blocks_per_program=min(num_qblocks, 8), single_tile=True,
                            num_warps=4, num_stages=2)
    if (variable_lengths and num_docs >= MANY_DOCS and element_size == 2 and dim <= MAX_BLOCK_D
            and 32 <= pow2(Lq) <= 64 and queries_per_block * pow2(Lq) == FULL_QUERY_BLOCK_ROWS):
        # Many packed documents and full 128-row query blocks (4 queries of 17-32 tokens, 2 of
        # 33-64): eight documents in order of length side by side, 16-token slots, one
        # [128 x 128] product a step (1.07-1.14x where the tensor cores bound the launch,
        # 1.02-1.04x where the read does: results/dense_variants/h100-757d1d9-slots-8x16).
        # A head that holds its tail (joins_tail) keeps the block held in registers across 8
        # documents in 32-token tiles.
        if joins_tail:
            return MaxSimConfig(block_t=32, queries_per_block=queries_per_block,
                                docs_per_program=8, hold_query=True, num_warps=4, num_stages=3)
        return MaxSimConfig(block_t=16, queries_per_block=queries_per_block, docs_per_program=8,
                            slots=True, num_warps=4, num_stages=2, length_order=True)
    if variable_lengths:
        # Short varied documents four at a time, 16-token slots: one [128 x 64] product per step.
        # A tile runs to its longest document: where the query block fills the product (the
        # tensor cores bound it), its documents are taken in order of length, 1.08-1.17x; with
        # fewer rows the launch is bound by the read, which that order scatters (B = 32, Lq = 1:
        # 0.95x; results/dense_variants/h100-d6b0648-slots-length).
        return MaxSimConfig(block_t=16, queries_per_block=queries_per_block, docs_per_program=4,
                            slots=True, num_warps=4, num_stages=2,
                            length_order=(queries_per_block * pow2(Lq) >= FULL_QUERY_BLOCK_ROWS
                                          and num_docs >= MANY_DOCS))
    return MaxSimConfig(block_t=64, queries_per_block=queries_per_block, num_warps=4, num_stages=2)


def _check_config(cfg: MaxSimConfig) -> None:
    """Tile sizes are tl.arange extents: powers of two (a slot tile also needs >= 16 rows, a
    d chunk is a tl.dot extent: >= 16)."""
    block_d = cfg.block_d
    if block_d is not None and not (isinstance(block_d, int) and not isinstance(block_d, bool)
                                    and MIN_DOT_DIM <= block_d <= MAX_BLOCK_D
                                    and block_d & (block_d - 1) == 0):
        raise ValueError(f"config.block_d must be None or a power of two in [{MIN_DOT_DIM}, "
                         f"{MAX_BLOCK_D}], got {block_d!r}")
    for name in ("block_t", "queries_per_block", "q_blocks_per_program", "docs_per_program"):
        value = getattr(cfg, name)
        if value < 1 or (name in ("block_t", "queries_per_block") and value & (value - 1)):
            raise ValueError(f"config.{name} must be a power of two >= 1, got {value}")
    if cfg.length_order and not cfg.slots:
        raise ValueError("config.length_order orders the documents of the slots kernel's tiles; "
                         "it needs slots=True")
    if cfg.slots and cfg.q_blocks_per_program != 1:
        # Its programs each hold one query block (no loop over several).
        raise ValueError(f"config.q_blocks_per_program must be 1 with slots, got "
                         f"{cfg.q_blocks_per_program}")
    if cfg.slots and (cfg.docs_per_program & (cfg.docs_per_program - 1)
                      or cfg.block_t * cfg.docs_per_program < MIN_DOT_DIM):
        raise ValueError(
            f"config.slots needs docs_per_program a power of two and block_t * docs_per_program >= "
            f"{MIN_DOT_DIM}; got block_t={cfg.block_t}, docs_per_program={cfg.docs_per_program}"
        )


def default_query_chunks(num_queries: int, Lq: int) -> list[int] | None:
    """Query tokens per launch of the default, where a query that fits one launch is split.

    Several queries are bound by the tensor cores, and a query block has a power of two of rows
    per query: 33 tokens cost the products of 64. Where the tokens past the largest power of two
    p >= 32 take at most p / 2 rows, two launches (p tokens, then the rest) read the documents
    twice but skip a quarter to a half of the products (the two parts' times in
    results/grid/h200-4613307-full, add up to less than the one launch's). One query is
    bound by the read, which a second launch repeats."""
    if num_queries < 4 or Lq <= 32 or Lq > MAX_LQ_PER_LAUNCH:
        return None
    head = 1 << (Lq.bit_length() - 1)
    if head == Lq or pow2(Lq - head) > head // 2:
        return None
    return [head, Lq - head]


def _row_offsets_fit_int32(rows: int, columns: int, stride_dt: int, stride_dd: int) -> bool:
    """Whether every element offset a tile computes within one document (``rows``: the longest
    document, or every row of D when that is not known, plus a whole tile of masked rows) fits
    int32, so the kernel takes its 32-bit row offsets (TOKENS_I32)."""
    return rows * abs(stride_dt) + columns * abs(stride_dd) < 2**31


def _tokens_i32(rows: int, num_d_tiles: int, block_d: int, stride_dt: int, stride_dd: int) -> bool:
    """The kernel's TOKENS_I32: 32-bit row offsets where d is one chunk and every offset fits.
    Over several d chunks the 64-bit ones were faster (d = 192-768:
    results/dense_variants/h200-81de55c)."""
    return num_d_tiles == 1 and _row_offsets_fit_int32(rows, block_d, stride_dt, stride_dd)


def _lengths_fit_int32(num_rows: int) -> bool:
    """The slots kernel's TOKENS_I32: no document of a packed tensor of ``num_rows`` rows is
    longer than int32 holds."""
    return num_rows < 2**31


def _repeat_rows(num_queries: int, cfg: MaxSimConfig, dim: int) -> bool:
    """The kernels' REPEAT_ROWS: a tile's rows past a document's end re-read its last row
    instead of masking every product to -inf. Several queries: the selects and reductions of
    their products keep the SM's compare/select pipe busier than its tensor pipe
    (results/profile/h200-8ad62da-batched), and a re-read row comes from L2. One query is bound
    by the read, where its masked rows are never fetched, except at d <= REPEAT_ROWS_MAX_DIM
    (rows of at most 128 bytes: as many selects for half the read;
    results/dense_variants/h200-b16d859-rows)."""
    return not cfg.running_max and (num_queries > 1 or dim <= REPEAT_ROWS_MAX_DIM)


def _length_order(offsets: torch.Tensor, pids: torch.Tensor | None) -> torch.Tensor:
    """int64 [M]: the output positions of the scored documents (``pids``, else every document)
    by length, shortest first (config.length_order). Every document scored: remembered while
    ``offsets`` is unchanged (checks.derived). A pid out of range is clamped here (validate=False
    promises none; the kernel reads what it is given)."""
    def make():
        lengths = offsets[1:] - offsets[:-1]
        if pids is not None and not lengths.numel():  # no document for any pid to name
            return torch.arange(pids.numel(), device=pids.device)
        if pids is not None:
            lengths = lengths[pids.clamp(0, lengths.numel() - 1)]
        return torch.argsort(lengths)

    return make() if pids is not None else checks.derived(offsets, "length_order", make)


def _flat_applies(cfg: MaxSimConfig, packed: bool, tail_tokens: int) -> bool:
    """What _maxsim_packed_flat_kernel covers: the held query over packed documents, no running
    max, no tail block, a power of two of documents a program."""
    return (packed and cfg.hold_query and not cfg.running_max and not tail_tokens
            and cfg.docs_per_program & (cfg.docs_per_program - 1) == 0)


def _flat_documents(num_queries: int, cfg: MaxSimConfig, packed: bool, tail_tokens: int,
                    mean_tokens: float) -> bool:
    """Whether the launch walks its documents' tiles as one loop (_maxsim_packed_flat_kernel,
    rows past a document's end repeated) instead of a loop per document: where _flat_applies,
    for one query held by one warp over documents of at most FLAT_MAX_MEAN_TOKENS tokens on
    average (``mean_tokens``: the packed tensor's rows per document). There the loop per
    document drains its software pipeline every two or three tiles (d <= 128: results/
    PERFORMANCE_LOG.md, run 147; d = 144-256, the held query in 32- and 64-column chunks: runs
    150, 160 and 164, an H100)."""
    return (num_queries == 1 and cfg.num_warps == 1 and mean_tokens <= FLAT_MAX_MEAN_TOKENS
            and _flat_applies(cfg, packed, tail_tokens))


# A split query's tail joins the head's launch only as a block of at least this many rows (its
# queries' tail tokens, a power of two each): 64-row tails beat a second launch at B = 4-32,
# smaller ones lost to it (results/dense_variants/h200-10976ef-tail).
TAIL_JOIN_MIN_ROWS = 64


def tail_joins_head(num_queries: int, head: int, tail: int, max_doc_len: int | None, dim: int,
                    variable_lengths: bool = False, num_docs: int = 0,
                    element_size: int = 2) -> bool:
    """Whether the default scores the ``tail`` tokens of a split query
    (:func:`default_query_chunks`) in the head's launch: where the head's config holds its query
    block across documents without a running max, and the same queries' tail tokens make a
    block of TAIL_JOIN_MIN_ROWS rows or more, that block is held beside it and multiplied by the
    same document tiles (the documents read once, not twice)."""
    cfg = default_config(num_queries, head, max_doc_len, dim, variable_lengths, num_docs,
                         element_size, joins_tail=True)
    return (cfg.hold_query and not cfg.running_max
            and _tail_lq(tail, cfg.queries_per_block) * cfg.queries_per_block
            >= TAIL_JOIN_MIN_ROWS)


def _tail_lq(tail: int, queries_per_block: int) -> int:
    """Rows per query of a tail block: a power of two, at least MIN_DOT_DIM rows in all."""
    return max(pow2(tail), cdiv(MIN_DOT_DIM, queries_per_block))


def _launch(Q3, D, *, packed, offsets, doc_lengths, pids, query_lengths, num_out_docs,
            padded_doc_len, max_doc_len, config):
    def launch(Q_chunk, chunk_lengths, tail_tokens=0):
        return _launch_kernel(Q_chunk, D, packed=packed, offsets=offsets, doc_lengths=doc_lengths,
                              pids=pids, query_lengths=chunk_lengths, num_out_docs=num_out_docs,
                              padded_doc_len=padded_doc_len, max_doc_len=max_doc_len,
                              config=config, tail_tokens=tail_tokens)

    chunks = default_query_chunks(Q3.shape[0], Q3.shape[1]) if config is None else None
    if chunks and tail_joins_head(Q3.shape[0], *chunks, max_doc_len, Q3.shape[2], packed,
                                  num_out_docs, Q3.element_size()):
        return launch_in_query_chunks(
            Q3, query_lengths, num_out_docs,
            lambda Q_all, lengths: launch(Q_all, lengths, tail_tokens=chunks[1]))
    return launch_in_query_chunks(Q3, query_lengths, num_out_docs, launch, config, _check_config,
                                  chunks)


def _launch_kernel(Q3, D, *, packed, offsets, doc_lengths, pids, query_lengths, num_out_docs,
                   padded_doc_len, max_doc_len, config, tail_tokens=0):
    """One launch; ``tail_tokens``: the last ones of Q3's tokens are scored as the held tail
    block of the head's launch (:func:`tail_joins_head`), the rest as its query block."""
    B, Lq, dim = Q3.shape
    out = torch.empty(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    head = Lq - tail_tokens
    mean_tokens = D.shape[0] / max(1, offsets.shape[0] - 1) if packed else 0.0
    cfg = config or default_config(B, head, max_doc_len, dim, variable_lengths=packed,
                                   num_docs=num_out_docs, element_size=Q3.element_size(),
                                   joins_tail=tail_tokens > 0, mean_tokens=mean_tokens,
                                   read_bandwidth=memory_bandwidth(Q3.device))
    _check_config(cfg)
    block_d = _block_d(dim) if cfg.block_d is None else cfg.block_d
    num_d_tiles = cdiv(dim, block_d)
    if num_d_tiles != 1 and cfg.block_d is not None and cfg.single_tile:
        raise ValueError(
            f"config.block_d={cfg.block_d} splits d={dim} into {num_d_tiles} chunks; "
            f"config.single_tile needs d in one chunk (block_d >= d)"
        )
    if cfg.hold_query and (num_d_tiles > MAX_HELD_CHUNKS or cfg.q_blocks_per_program != 1
                           or cfg.single_tile or cfg.slots):
        raise ValueError(
            f"config.hold_query needs at most {MAX_HELD_CHUNKS} chunks of d (d / block_d), "
            f"q_blocks_per_program = 1 and the tiled per-document path (no single_tile or slots); "
            f"got {num_d_tiles} chunks (d={dim}, block_d={block_d}), "
            f"q_blocks_per_program={cfg.q_blocks_per_program}, single_tile={cfg.single_tile}, "
            f"slots={cfg.slots}"
        )
    if cfg.running_max and (cfg.single_tile or cfg.slots):
        raise ValueError("config.running_max needs the tiled per-document path (no single_tile "
                         f"or slots); got single_tile={cfg.single_tile}, slots={cfg.slots}")
    if cfg.single_tile and (max_doc_len is None or max_doc_len > cfg.block_t or num_d_tiles != 1):
        raise ValueError(
            f"config.single_tile needs every document within block_t={cfg.block_t} tokens and d <= "
            f"{MAX_BLOCK_D}; got max_doc_len={max_doc_len}, d={dim}"
        )
    lq = pow2(head)
    queries_per_block = max(cfg.queries_per_block, cdiv(MIN_DOT_DIM, lq))
    num_qblocks = cdiv(B, queries_per_block)
    tail_lq = _tail_lq(tail_tokens, queries_per_block) if tail_tokens else 0
    if tail_tokens and not (cfg.hold_query and not cfg.running_max and head == lq):
        raise ValueError(f"a tail of {tail_tokens} query tokens joins a launch of the held query "
                         f"block without running_max over a power of two of tokens; got {cfg}, "
                         f"{head} head tokens")
    q_blocks_per_program = min(cfg.q_blocks_per_program, num_qblocks)
    num_qgroups = cdiv(num_qblocks, q_blocks_per_program)
    num_doc_programs = cdiv(num_out_docs, cfg.docs_per_program)
    dummy = out  # any tensor: pointer arguments behind a False constexpr are never read
    # Launch arguments every dense kernel takes.
    common = dict(BLOCK_D=block_d, NUM_D_TILES=num_d_tiles, INPUT_PRECISION=dot_precision(Q3.dtype),
                  UPCAST=interpreter_upcast(Q3.dtype), num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages)
    if cfg.slots and not packed:
        raise ValueError("config.slots is for the packed layout (maxsim_packed)")
    rem_d = _remainder_chunk(dim, block_d)
    # The tiled kernels' chunks: whole ones, then the remainder (the slots kernel masks it).
    chunks = dict(NUM_D_TILES=num_d_tiles - (rem_d > 0), REM_D=rem_d,
                  EVEN_D=dim % block_d == 0 or rem_d > 0)
    if cfg.slots or (D.shape[0] and _flat_documents(B, cfg, packed, tail_tokens, mean_tokens)):
        # The packed-only kernels: documents side by side, or the flat walk.
        args = (Q3, D, offsets, pids if pids is not None else dummy,
                query_lengths if query_lengths is not None else dummy, out,
                num_out_docs, B, Lq, dim)
        strides = (*Q3.stride(), D.stride(0), D.stride(1), *out.stride(), num_qgroups)
        kwargs = dict(HAS_PIDS=pids is not None, HAS_QUERY_LENGTHS=query_lengths is not None,
                      LQ=lq, QUERIES_PER_BLOCK=queries_per_block, **common)
        grid = (num_doc_programs * num_qgroups,)
        if cfg.slots:
            order = _length_order(offsets, pids) if cfg.length_order and num_out_docs else None
            _maxsim_packed_slots_kernel[grid](
                *args[:5], order if order is not None else dummy, *args[5:], *strides,
                SLOT_T=max(1, cfg.block_t), DOCS_PER_TILE=cfg.docs_per_program,
                REPEAT_ROWS=_repeat_rows(B, cfg, dim),
                TOKENS_I32=_lengths_fit_int32(D.shape[0]), HAS_ORDER=order is not None,
                **kwargs)
        else:
            block_t = max(MIN_DOT_DIM, cfg.block_t)
            _maxsim_packed_flat_kernel[grid](
                *args, D.shape[0], *strides, BLOCK_T=block_t,
                DOCS_PER_PROGRAM=cfg.docs_per_program,
                TOKENS_I32=_row_offsets_fit_int32(
                    (max_doc_len if max_doc_len is not None else D.shape[0]) + block_t,
                    num_d_tiles * block_d, D.stride(0), D.stride(1)),
                **{**kwargs, **chunks})
        return out
    stride_dn = 0 if packed else D.stride(0)
    stride_dt, stride_dd = D.stride(-2), D.stride(-1)
    tokens_i32 = _tokens_i32(
        (max_doc_len if max_doc_len is not None else D.shape[-2]) + max(MIN_DOT_DIM, cfg.block_t),
        num_d_tiles, block_d, stride_dt, stride_dd)
    _maxsim_dense_kernel[(num_doc_programs * num_qgroups,)](
        Q3, D,
        offsets if packed else dummy,
        doc_lengths if doc_lengths is not None else dummy,
        pids if pids is not None else dummy,
        query_lengths if query_lengths is not None else dummy,
        out,
        num_out_docs, B, Lq, dim, padded_doc_len,
        Q3.stride(0), Q3.stride(1), Q3.stride(2),
        stride_dn, stride_dt, stride_dd,
        out.stride(0), out.stride(1),
        num_qgroups,
        PACKED=packed,
        HAS_DOC_LENGTHS=doc_lengths is not None,
        HAS_PIDS=pids is not None,
        HAS_QUERY_LENGTHS=query_lengths is not None,
        LQ=lq,
        QUERIES_PER_BLOCK=queries_per_block,
        Q_BLOCKS_PER_PROGRAM=q_blocks_per_program,
        BLOCK_T=max(MIN_DOT_DIM, cfg.block_t),
        DOCS_PER_PROGRAM=cfg.docs_per_program,
        SINGLE_TILE=cfg.single_tile,
        HOLD_QUERY=cfg.hold_query,
        TOKENS_I32=tokens_i32,
        RUNNING_MAX=cfg.running_max,
        TAIL_LQ=tail_lq,
        REPEAT_ROWS=_repeat_rows(B, cfg, dim),
        **{**common, **chunks},
    )
    return out


@scoring_op
@checks.rerun_if_stale
def maxsim_padded(
    Q: torch.Tensor,
    D: torch.Tensor,
    doc_lengths: torch.Tensor | None = None,
    query_lengths: torch.Tensor | None = None,
    *,
    config: MaxSimConfig | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Exact MaxSim of queries against padded documents.

    Args:
        Q: [B, Lq, d] or [Lq, d], fp16 / bf16 / fp32.
        D: [N, Ld, d], same dtype and device as Q. Q and D are read through their strides.
        doc_lengths: optional int32/int64 [N]; tokens at or past a document's length never win
            a max. Default: every document has Ld tokens. A single-tile ``config`` needs every
            document within its block_t: read from doc_lengths when ``validate`` is True, else
            Ld.
        query_lengths: optional int32/int64 [B] (3-D Q only); padded query tokens add nothing.
            A strided view of doc_lengths or query_lengths is copied once (a few bytes per
            document).
        config: a fixed :class:`MaxSimConfig` (no heuristics, CUDA-graph friendly).
        validate: check values as well as shapes: all value checks of a call are read back in
            one host sync, and a tensor passed again unchanged (same object and version,
            ``checks.DataChecks``) is not read again. Q and D are not read. A new doc_lengths
            (but with a single-tile config) or query_lengths (a reranker's batch) is judged
            after the launch, which reads it clamped into range, so the GPU does not wait for
            the check.

    Returns:
        fp32 [B, N], or [N] for a 2-D Q. An empty document scores -inf, an empty query 0. A NaN
        in Q or in a token of D that is read makes exactly the scores it touches NaN, as in
        torch; inf as torch gives it (docs/kernels.md, NaN and inf).
    """
    checks.check_query(Q)
    checks.check_tensor("D", D, dims=(3,), dtypes=checks.FLOAT_DTYPES, device=Q.device)
    checks.check_same_dtype("D", D, Q)
    checks.check_same_dim("D", D, Q)
    checks.query_lengths_shape(query_lengths, Q)
    checks.lengths_shape("doc_lengths", doc_lengths, D.shape[0], Q.device)
    max_doc_len = D.shape[1]
    batch = checks.DataChecks(provisional=True)
    if validate:
        checks.add_query_lengths(batch, query_lengths, Q, defer=True)
        # A single-tile config needs the longest document before the launch; otherwise a new
        # doc_lengths waits until after it.
        needs_longest = config is not None and config.single_tile
        batch.in_range("doc_lengths", doc_lengths, 0, D.shape[1] + 1, f"[0, {D.shape[1]}]",
                       defer=not needs_longest)
        stats = batch.run()
        if stats.get("doc_lengths"):  # read now, or remembered from an earlier call
            max_doc_len = stats["doc_lengths"][1]
        query_lengths = batch.safe("query_lengths", query_lengths)
        doc_lengths = batch.safe("doc_lengths", doc_lengths)
    # The kernel reads Q and D through their strides; the 1-D tensors by element.
    doc_lengths, query_lengths = checks.unit_stride(doc_lengths), checks.unit_stride(query_lengths)
    Q3 = Q[None] if Q.dim() == 2 else Q
    out = _launch(Q3, D, packed=False, offsets=None, doc_lengths=doc_lengths, pids=None,
                  query_lengths=query_lengths, num_out_docs=D.shape[0], padded_doc_len=D.shape[1],
                  max_doc_len=max_doc_len, config=config)
    batch.finish()
    return out[0] if Q.dim() == 2 else out


@scoring_op
@checks.rerun_if_stale
def maxsim_packed(
    Q: torch.Tensor,
    D_packed: torch.Tensor,
    offsets: torch.Tensor,
    pids: torch.Tensor | None = None,
    *,
    query_lengths: torch.Tensor | None = None,
    max_doc_len: int | None = None,
    config: MaxSimConfig | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Exact MaxSim over PLAID's packed layout, optionally for a subset of documents in place.

    Args:
        Q: [B, Lq, d] or [Lq, d], fp16 / bf16 / fp32.
        D_packed: [T, d], all document tokens concatenated, same dtype and device as Q. Q and
            D_packed are read through their strides; a strided view of offsets, pids or
            query_lengths is copied once (8 bytes per document).
        offsets: int64 [N+1]; document n owns rows ``offsets[n]:offsets[n+1]``.
        pids: optional int32/int64 [M]: score only these documents, in this order, read straight
            from ``D_packed`` (no gather into a new tensor). Default: all N documents.
        query_lengths: optional int32/int64 [B] (3-D Q only).
        max_doc_len: the longest document in ``offsets`` if known (lets several queries take
            the single-tile path without a device sync; ``validate=True`` checks it); read
            from ``offsets`` when ``validate`` is True.
        config: a fixed :class:`MaxSimConfig`.
        validate: check values (offsets monotone and in range, pids and query_lengths in
            range; Q and D_packed are not read) with one host sync per call, none when every
            checked tensor was checked before unchanged (same object and version: an index's
            offsets are read once). A new pids or query_lengths, and a new offsets for one
            query or with ``max_doc_len`` given, is judged after the launch, which reads it
            clamped into range, so checking a new batch each call does not leave the GPU idle.

    Returns:
        fp32 [B, M] (or [M] for a 2-D Q), M = len(pids) or N. An empty document scores -inf,
        an empty query 0. A NaN in Q or in a scored document's row makes exactly the scores it
        touches NaN, as in torch; inf as torch gives it (docs/kernels.md, NaN and inf).
    """
    checks.check_query(Q)
    checks.check_tensor("D_packed", D_packed, dims=(2,), dtypes=checks.FLOAT_DTYPES, device=Q.device)
    checks.check_same_dtype("D_packed", D_packed, Q)
    checks.check_same_dim("D_packed", D_packed, Q)
    checks.check_offsets_shape(offsets, Q.device)
    num_docs = offsets.numel() - 1
    checks.pids_shape(pids, Q.device)
    checks.query_lengths_shape(query_lengths, Q)
    batch = checks.DataChecks(provisional=True)
    if validate:
        checks.add_query_lengths(batch, query_lengths, Q, defer=True)
        # The launch takes the longest document from offsets only for several queries' tiling
        # and a single-tile config: without them (or with a caller's max_doc_len) a new
        # offsets waits until after it.
        needs_longest = (not (Q.dim() == 2 or Q.shape[0] == 1)
                         or (config is not None and config.single_tile))
        batch.offsets(offsets, D_packed.shape[0],
                      defer=not needs_longest or max_doc_len is not None, longest=max_doc_len)
        batch.in_range("pids", pids, 0, num_docs, defer=True)
        stats = batch.run()
        if max_doc_len is None and num_docs and "offsets" in stats:
            max_doc_len = stats["offsets"][3]
        pids, query_lengths = batch.safe("pids", pids), batch.safe("query_lengths", query_lengths)
        offsets = batch.safe("offsets", offsets)
    # The kernel reads Q and D_packed through their strides; the 1-D tensors by element.
    offsets, pids = checks.unit_stride(offsets), checks.unit_stride(pids)
    query_lengths = checks.unit_stride(query_lengths)
    Q3 = Q[None] if Q.dim() == 2 else Q
    num_out = pids.numel() if pids is not None else num_docs
    out = _launch(Q3, D_packed, packed=True, offsets=offsets, doc_lengths=None, pids=pids,
                  query_lengths=query_lengths, num_out_docs=num_out, padded_doc_len=0,
                  max_doc_len=max_doc_len, config=config)
    batch.finish()
    return out[0] if Q.dim() == 2 else out
