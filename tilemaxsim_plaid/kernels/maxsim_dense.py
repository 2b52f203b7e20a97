"""TileMaxSim dense kernel: exact MaxSim over padded or packed (PLAID) document embeddings.

    score[b, n] = sum_i max_j <Q[b, i], D[n, j]>

One program scores DOCS_PER_PROGRAM documents against Q_BLOCKS_PER_PROGRAM blocks of queries.
A query block stacks QUERIES_PER_BLOCK queries, each padded (in registers only) to LQ rows, so
one tensor-core product scores a document tile against several queries at once. The running
maximum of every query row stays in registers; no similarity matrix is written to memory.

Ways to walk a document:
* SINGLE_TILE (every document fits one [BLOCK_T, BLOCK_D] tile): the tile is loaded from HBM
  once and then reused from registers/shared memory by every query block of the program
  (cross-query tiling).
* otherwise: tiles of BLOCK_T tokens; the embedding dimension is walked in NUM_D_TILES chunks of
  BLOCK_D and, where REM_D > 0, one last chunk of REM_D columns (d = 384 as 3 x 128 or 6 x 64,
  d = 144 as 128 + 16, d = 96 as one masked 128 chunk, 3 x 32 or 64 + 32: the host's config
  chooses), so d is never padded in memory.
* _maxsim_packed_slots_kernel (packed only): several short documents side by side in one tile,
  so one tensor-core product scores them all against a block of several queries.
* _maxsim_packed_flat_kernel (packed, held query): the tiles of a program's documents as one
  loop, so the software pipeline runs across document boundaries.

Masking: a document token at or past the document's length never wins a max: its products are
-inf, or with REPEAT_ROWS its row is the document's last row again; a query row past its
query's length contributes 0 to the sum. A document of length 0 therefore scores -inf, and a
query of length 0 scores 0.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import max_nan, maximum_nan, packed_doc_bounds, tile_dot


@triton.jit
def _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                HAS_QUERY_LENGTHS: tl.constexpr, LQ: tl.constexpr,
                QUERIES_PER_BLOCK: tl.constexpr, FIRST_TOKEN: tl.constexpr = 0):
    """Query index, token index and validity of each row of a query block: LQ rows per query,
    its tokens FIRST_TOKEN .. FIRST_TOKEN + LQ - 1."""
    offs_r = tl.arange(0, QUERIES_PER_BLOCK * LQ)
    offs_b = pid_qblock * QUERIES_PER_BLOCK + offs_r // LQ
    offs_i = FIRST_TOKEN + offs_r % LQ
    mask_b = offs_b < num_queries
    if HAS_QUERY_LENGTHS:
        q_len = tl.load(p_query_lengths + offs_b, mask=mask_b, other=0)
    else:
        q_len = Lq
    mask_r = mask_b & (offs_i < q_len)
    return offs_b, offs_i, mask_r


@triton.jit
def _load_query_tile(p_q, offs_b, offs_i, mask_r, d0, dim, stride_qb, stride_qt, stride_qd,
                     BLOCK_D: tl.constexpr):
    offs_d = d0 + tl.arange(0, BLOCK_D)
    p = p_q + offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt + offs_d[None, :] * stride_qd
    # [BLOCK_Q, BLOCK_D]
    return tl.load(p, mask=mask_r[:, None] & (offs_d[None, :] < dim), other=0.0)


@triton.jit
def _held_query(p_q, offs_b, offs_i, mask_r, dim, stride_qb, stride_qt, stride_qd,
                BLOCK_D: tl.constexpr, NUM_D_TILES: tl.constexpr, REM_D: tl.constexpr):
    """A query block as a tuple of register tiles, one per chunk of d: NUM_D_TILES of BLOCK_D
    columns, then one of REM_D columns where REM_D > 0."""
    q_held = ()
    for k in tl.static_range(NUM_D_TILES):
        q_held = q_held + (_load_query_tile(p_q, offs_b, offs_i, mask_r, k * BLOCK_D, dim,
                                            stride_qb, stride_qt, stride_qd, BLOCK_D),)
    if REM_D > 0:
        q_held = q_held + (_load_query_tile(p_q, offs_b, offs_i, mask_r, NUM_D_TILES * BLOCK_D,
                                            dim, stride_qb, stride_qt, stride_qd, REM_D),)
    return q_held


@triton.jit
def _load_doc_tile(p_doc, t0, doc_len, d0, dim, stride_dt, stride_dd,
                   BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
                   FULL: tl.constexpr = False, REPEAT_ROWS: tl.constexpr = False):
    """[BLOCK_T, BLOCK_D] rows t0.. of a document; FULL: every row is within the document.
    REPEAT_ROWS: rows past the document's end are its last row again (an empty document's are
    masked), so no product needs a mask; with FULL the document is not empty."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    if REPEAT_ROWS:
        offs_t = tl.minimum(offs_t, tl.maximum(doc_len - 1, 0))
    offs_d = d0 + tl.arange(0, BLOCK_D)
    p = p_doc + offs_t[:, None] * stride_dt + offs_d[None, :] * stride_dd
    # Masked rows are never fetched, so short documents cost only their bytes.
    if FULL and EVEN_D:
        return tl.load(p)
    if FULL:
        return tl.load(p, mask=offs_d[None, :] < dim, other=0.0)
    if EVEN_D:  # every chunk is whole: the rows' mask only
        return tl.load(p, mask=offs_t[:, None] < doc_len, other=0.0)
    return tl.load(p, mask=(offs_t[:, None] < doc_len) & (offs_d[None, :] < dim), other=0.0)


@triton.jit
def _tile_sim(q_held, p_q, offs_b, offs_i, mask_r, p_doc, t0, doc_len, dim,
              stride_qb, stride_qt, stride_qd, stride_dt, stride_dd,
              ROWS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
              NUM_D_TILES: tl.constexpr, HOLD_QUERY: tl.constexpr, EVEN_D: tl.constexpr,
              FULL: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
              REPEAT_ROWS: tl.constexpr = False, REM_D: tl.constexpr = 0):
    """[ROWS, BLOCK_T] fp32 products of the query block with document rows t0 .. t0 + BLOCK_T
    (rows past the document are 0 here, and the caller masks them, or with REPEAT_ROWS the last
    row's products again). FULL: all rows are in it. REM_D: the last chunk of d (_held_query)."""
    sim = tl.zeros([ROWS, BLOCK_T], tl.float32)
    if HOLD_QUERY:
        # The held chunks are a tuple: indexed by a compile-time k.
        for k in tl.static_range(NUM_D_TILES):
            d_tile = _load_doc_tile(p_doc, t0, doc_len, k * BLOCK_D, dim, stride_dt, stride_dd,
                                    BLOCK_T, BLOCK_D, EVEN_D, FULL, REPEAT_ROWS)
            sim += tile_dot(q_held[k], d_tile, INPUT_PRECISION, UPCAST)
    else:
        # A dynamic loop (like a GEMM's K loop) so Triton software-pipelines the loads of the
        # next chunk of d behind this chunk's product.
        for k in range(NUM_D_TILES):
            q_tile = _load_query_tile(p_q, offs_b, offs_i, mask_r, k * BLOCK_D, dim,
                                      stride_qb, stride_qt, stride_qd, BLOCK_D)
            d_tile = _load_doc_tile(p_doc, t0, doc_len, k * BLOCK_D, dim, stride_dt, stride_dd,
                                    BLOCK_T, BLOCK_D, EVEN_D, FULL, REPEAT_ROWS)
            # [ROWS, BLOCK_D] @ [BLOCK_D, BLOCK_T] -> [ROWS, BLOCK_T]
            sim += tile_dot(q_tile, d_tile, INPUT_PRECISION, UPCAST)
    if REM_D > 0:
        if HOLD_QUERY:
            q_rem = q_held[NUM_D_TILES]
        else:
            q_rem = _load_query_tile(p_q, offs_b, offs_i, mask_r, NUM_D_TILES * BLOCK_D, dim,
                                     stride_qb, stride_qt, stride_qd, REM_D)
        d_tile = _load_doc_tile(p_doc, t0, doc_len, NUM_D_TILES * BLOCK_D, dim, stride_dt,
                                stride_dd, BLOCK_T, REM_D, True, FULL, REPEAT_ROWS)
        sim += tile_dot(q_rem, d_tile, INPUT_PRECISION, UPCAST)
    return sim


@triton.jit
def _tile_sim_with_tail(q_held, q_tail, p_doc, t0, doc_len, dim, stride_dt, stride_dd,
                        ROWS: tl.constexpr, TAIL_ROWS: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_D: tl.constexpr, NUM_D_TILES: tl.constexpr, EVEN_D: tl.constexpr,
                        INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                        REPEAT_ROWS: tl.constexpr = False, REM_D: tl.constexpr = 0):
    """_tile_sim of a held query block and of a held block of the same queries' tail tokens,
    from one read of the document tile: ([ROWS, BLOCK_T], [TAIL_ROWS, BLOCK_T])."""
    sim = tl.zeros([ROWS, BLOCK_T], tl.float32)
    sim_tail = tl.zeros([TAIL_ROWS, BLOCK_T], tl.float32)
    for k in tl.static_range(NUM_D_TILES):
        d_tile = _load_doc_tile(p_doc, t0, doc_len, k * BLOCK_D, dim, stride_dt, stride_dd,
                                BLOCK_T, BLOCK_D, EVEN_D, REPEAT_ROWS, REPEAT_ROWS)
        sim += tile_dot(q_held[k], d_tile, INPUT_PRECISION, UPCAST)
        sim_tail += tile_dot(q_tail[k], d_tile, INPUT_PRECISION, UPCAST)
    if REM_D > 0:
        d_tile = _load_doc_tile(p_doc, t0, doc_len, NUM_D_TILES * BLOCK_D, dim, stride_dt,
                                stride_dd, BLOCK_T, REM_D, True, REPEAT_ROWS, REPEAT_ROWS)
        sim += tile_dot(q_held[NUM_D_TILES], d_tile, INPUT_PRECISION, UPCAST)
        sim_tail += tile_dot(q_tail[NUM_D_TILES], d_tile, INPUT_PRECISION, UPCAST)
    return sim, sim_tail


@triton.jit
def _query_sums(row_max, mask_r, LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr):
    """[QUERIES_PER_BLOCK] sums of the valid rows' maxima, LQ rows per query."""
    # where(), not a multiply: 0 * -inf is NaN for an empty document.
    contrib = tl.where(mask_r, row_max, 0.0)
    return tl.sum(tl.reshape(contrib, [QUERIES_PER_BLOCK, LQ]), axis=1)


@triton.jit
def _store_sums(p_out, per_query, pid_qblock, out_idx, num_queries, valid_doc, stride_ob,
                stride_on, QUERIES_PER_BLOCK: tl.constexpr):
    offs_b = pid_qblock * QUERIES_PER_BLOCK + tl.arange(0, QUERIES_PER_BLOCK)
    # A program past the last document stores nothing: no query index is below 0.
    num_stored = tl.where(valid_doc, num_queries, 0)
    tl.store(p_out + offs_b * stride_ob + out_idx * stride_on, per_query, mask=offs_b < num_stored)


@triton.jit
def _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries, valid_doc,
                        stride_ob, stride_on, LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr):
    _store_sums(p_out, _query_sums(row_max, mask_r, LQ, QUERIES_PER_BLOCK), pid_qblock, out_idx,
                num_queries, valid_doc, stride_ob, stride_on, QUERIES_PER_BLOCK)


@triton.jit
def _maxsim_dense_kernel(
    p_q, p_d, p_offsets, p_doc_lengths, p_pids, p_query_lengths, p_out,
    num_out_docs, num_queries, Lq, dim, padded_doc_len,
    stride_qb, stride_qt, stride_qd,
    stride_dn, stride_dt, stride_dd,
    stride_ob, stride_on,
    num_qgroups,
    PACKED: tl.constexpr, HAS_DOC_LENGTHS: tl.constexpr, HAS_PIDS: tl.constexpr,
    HAS_QUERY_LENGTHS: tl.constexpr,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr, Q_BLOCKS_PER_PROGRAM: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D_TILES: tl.constexpr,
    DOCS_PER_PROGRAM: tl.constexpr, SINGLE_TILE: tl.constexpr, HOLD_QUERY: tl.constexpr,
    EVEN_D: tl.constexpr, TOKENS_I32: tl.constexpr, RUNNING_MAX: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TAIL_LQ: tl.constexpr = 0,
    REPEAT_ROWS: tl.constexpr = False, REM_D: tl.constexpr = 0,
):
    """Q: [B, Lq, d] (strides q*); D: [N, Ld, d] padded or [T, d] packed (strides d*; stride_dn
    unused when packed); offsets: int64 [N+1] when packed; doc_lengths: [N] when padded (else
    padded_doc_len); pids: [M] documents to score (else 0..M-1); out: fp32 [B, M].
    HOLD_QUERY (one query block per program, tiled path): the query block is loaded once per
    program, as one register tile per d chunk (a tuple of NUM_D_TILES tiles: d = 96 as 3 x 32
    with no masked column), and held across all its tiles and documents, instead of once per
    document; the chunk loop is then unrolled. REM_D (tiled path): d is NUM_D_TILES chunks of
    BLOCK_D and one last chunk of REM_D columns (d = 144 as 128 + 16), none masked. EVEN_D: no
    chunk has a column past d (no column mask on document tiles). TOKENS_I32: row offsets
    within a document, times stride_dt, fit int32. RUNNING_MAX (tiled path): a document's
    whole tiles are loaded unmasked and kept in an elementwise running max over the tile,
    reduced over tokens once per document, instead of masking every tile and reducing it over
    tokens (a select, a reduction and cross-lane shuffles per tile). TAIL_LQ (HOLD_QUERY without RUNNING_MAX): the query block covers tokens
    0 .. LQ - 1 of its queries, and a second held block of TAIL_LQ rows per query their tokens
    LQ .. LQ + TAIL_LQ - 1 (Lq is the whole length), multiplied by the same document tiles, so
    a query a little longer than a power of two is scored in one read of the documents.
    REPEAT_ROWS (SINGLE_TILE, or the tiled path without RUNNING_MAX): a tile's rows past the
    document's end load its last row again, which cannot change a max, instead of being masked
    to -inf in every product: a select per product saved, at the cost of re-reading that row
    (an empty document is -inf by one select per query row)."""
    # Query groups vary fastest so the programs reading the same documents run side by side and
    # every document byte after the first read comes from L2.
    pid = tl.program_id(0)
    pid_qgroup = pid % num_qgroups
    pid_docs = pid // num_qgroups
    if HOLD_QUERY:
        # Loading the [32, 128] query block once per document (Triton already keeps it out of
        # the tile loop) costs about a tenth of the read roof at MS MARCO-like lengths; held
        # here, it is loaded once per program.
        offs_b_held, offs_i_held, mask_r_held = _query_rows(pid_qgroup, Lq, p_query_lengths,
                                                            num_queries, HAS_QUERY_LENGTHS, LQ,
                                                            QUERIES_PER_BLOCK)
        q_held = _held_query(p_q, offs_b_held, offs_i_held, mask_r_held, dim, stride_qb,
                             stride_qt, stride_qd, BLOCK_D, NUM_D_TILES, REM_D)
        q_tail = ()
        if TAIL_LQ > 0:
            offs_b_tail, offs_i_tail, mask_r_tail = _query_rows(
                pid_qgroup, Lq, p_query_lengths, num_queries, HAS_QUERY_LENGTHS, TAIL_LQ,
                QUERIES_PER_BLOCK, LQ)
            q_tail = _held_query(p_q, offs_b_tail, offs_i_tail, mask_r_tail, dim, stride_qb,
                                 stride_qt, stride_qd, BLOCK_D, NUM_D_TILES, REM_D)
    else:
        q_held = ()  # each tile reads the query (_tile_sim)

    for doc_step in range(DOCS_PER_PROGRAM):
        out_idx = pid_docs.to(tl.int64) * DOCS_PER_PROGRAM + doc_step
        if PACKED:
            valid_doc, start, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs,
                                                      HAS_PIDS)
            doc_len = end - start
            p_doc = p_d + start * stride_dt
        else:
            # Padded documents are scored in order; a slot past the end is an empty document
            # whose score is never stored (branch-free, as packed_doc_bounds).
            valid_doc = out_idx < num_out_docs
            if HAS_DOC_LENGTHS:
                doc_len = tl.load(p_doc_lengths + out_idx, mask=valid_doc, other=0).to(tl.int64)
            else:
                doc_len = tl.where(valid_doc, padded_doc_len, 0).to(tl.int64)
            p_doc = p_d + out_idx * stride_dn
        if TOKENS_I32:
            # Every row offset within a document fits 32 bits (the host checks): the tile loop's
            # addresses and masks in half the integer instructions of 64-bit ones.
            doc_len = doc_len.to(tl.int32)

        if SINGLE_TILE:
            # [BLOCK_T, BLOCK_D]: read from HBM once, reused by every query block below.
            d_tile = _load_doc_tile(p_doc, 0, doc_len, 0, dim, stride_dt, stride_dd, BLOCK_T, BLOCK_D,
                                    EVEN_D, REPEAT_ROWS=REPEAT_ROWS)
            mask_t = tl.arange(0, BLOCK_T) < doc_len
            for qb in tl.static_range(Q_BLOCKS_PER_PROGRAM):
                pid_qblock = pid_qgroup * Q_BLOCKS_PER_PROGRAM + qb
                offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                                     HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
                q_tile = _load_query_tile(p_q, offs_b, offs_i, mask_r, 0, dim,
                                          stride_qb, stride_qt, stride_qd, BLOCK_D)
                # [BLOCK_Q, BLOCK_D] @ [BLOCK_D, BLOCK_T] -> [BLOCK_Q, BLOCK_T]
                sim = tile_dot(q_tile, d_tile, INPUT_PRECISION, UPCAST)
                if REPEAT_ROWS:
                    row_max = tl.where(doc_len > 0, max_nan(sim, 1), float("-inf"))
                else:
                    row_max = max_nan(tl.where(mask_t[None, :], sim, float("-inf")), 1)
                _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                                    valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)
        else:
            ROWS: tl.constexpr = QUERIES_PER_BLOCK * LQ  # once: a constexpr is not reassigned
            for qb in tl.static_range(Q_BLOCKS_PER_PROGRAM):
                pid_qblock = pid_qgroup * Q_BLOCKS_PER_PROGRAM + qb
                offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                                     HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
                if RUNNING_MAX:
                    # Whole tiles unmasked into an elementwise running max, reduced over tokens
                    # (cross-lane shuffles) once per document; only the last partial tile is
                    # masked.
                    full_end = (doc_len // BLOCK_T) * BLOCK_T
                    run = tl.full([ROWS, BLOCK_T], float("-inf"), tl.float32)
                    for t0 in range(0, full_end, BLOCK_T):
                        run = maximum_nan(run, _tile_sim(
                            q_held, p_q, offs_b, offs_i, mask_r, p_doc, t0, doc_len, dim,
                            stride_qb, stride_qt, stride_qd, stride_dt, stride_dd, ROWS, BLOCK_T,
                            BLOCK_D, NUM_D_TILES, HOLD_QUERY, EVEN_D, True, INPUT_PRECISION,
                            UPCAST, REM_D=REM_D))
                    if full_end < doc_len:
                        sim = _tile_sim(q_held, p_q, offs_b, offs_i, mask_r, p_doc, full_end,
                                        doc_len, dim, stride_qb, stride_qt, stride_qd, stride_dt,
                                        stride_dd, ROWS, BLOCK_T, BLOCK_D, NUM_D_TILES,
                                        HOLD_QUERY, EVEN_D, False, INPUT_PRECISION, UPCAST,
                                        REM_D=REM_D)
                        mask_t = (full_end + tl.arange(0, BLOCK_T)) < doc_len
                        run = maximum_nan(run, tl.where(mask_t[None, :], sim, float("-inf")))
                    row_max = max_nan(run, 1)
                else:
                    row_max = tl.full([ROWS], float("-inf"), tl.float32)
                    if TAIL_LQ > 0:
                        tail_max = tl.full([QUERIES_PER_BLOCK * TAIL_LQ], float("-inf"),
                                           tl.float32)
                    # With REPEAT_ROWS every tile is whole: an empty document runs none.
                    for t0 in range(0, doc_len, BLOCK_T):
                        if not REPEAT_ROWS:
                            mask_t = (t0 + tl.arange(0, BLOCK_T)) < doc_len
                        if TAIL_LQ > 0:
                            sim, sim_tail = _tile_sim_with_tail(
                                q_held, q_tail, p_doc, t0, doc_len, dim, stride_dt, stride_dd,
                                ROWS, QUERIES_PER_BLOCK * TAIL_LQ, BLOCK_T, BLOCK_D,
                                NUM_D_TILES, EVEN_D, INPUT_PRECISION, UPCAST, REPEAT_ROWS,
                                REM_D)
                            if not REPEAT_ROWS:
                                sim_tail = tl.where(mask_t[None, :], sim_tail, float("-inf"))
                            tail_max = maximum_nan(tail_max, max_nan(sim_tail, 1))
                        else:
                            sim = _tile_sim(q_held, p_q, offs_b, offs_i, mask_r, p_doc, t0,
                                            doc_len, dim, stride_qb, stride_qt, stride_qd,
                                            stride_dt, stride_dd, ROWS, BLOCK_T, BLOCK_D,
                                            NUM_D_TILES, HOLD_QUERY, EVEN_D, REPEAT_ROWS,
                                            INPUT_PRECISION, UPCAST, REPEAT_ROWS, REM_D)
                        if not REPEAT_ROWS:
                            sim = tl.where(mask_t[None, :], sim, float("-inf"))
                        row_max = maximum_nan(row_max, max_nan(sim, 1))
                if TAIL_LQ > 0:
                    per_query = (_query_sums(row_max, mask_r, LQ, QUERIES_PER_BLOCK)
                                 + _query_sums(tail_max, mask_r_tail, TAIL_LQ, QUERIES_PER_BLOCK))
                    _store_sums(p_out, per_query, pid_qblock, out_idx, num_queries, valid_doc,
                                stride_ob, stride_on, QUERIES_PER_BLOCK)
                else:
                    _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                                        valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)


@triton.jit
def _maxsim_packed_flat_kernel(
    p_q, p_d, p_offsets, p_pids, p_query_lengths, p_out,
    num_out_docs, num_queries, Lq, dim, num_rows,
    stride_qb, stride_qt, stride_qd,
    stride_dt, stride_dd,
    stride_ob, stride_on,
    num_qgroups,
    HAS_PIDS: tl.constexpr, HAS_QUERY_LENGTHS: tl.constexpr,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D_TILES: tl.constexpr,
    DOCS_PER_PROGRAM: tl.constexpr, EVEN_D: tl.constexpr, TOKENS_I32: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, REM_D: tl.constexpr = 0,
):
    """_maxsim_dense_kernel's held query over packed documents, the tiles of a program's
    DOCS_PER_PROGRAM documents walked as one loop instead of a loop per document, so the
    software pipeline loads the next document's first tiles while this one's last are
    multiplied instead of draining at every document. The current document's bounds and the
    next one's are loop scalars, the one after read when a document ends. A document is scored
    at its last tile. Rows past a document's end repeat its last row (REPEAT_ROWS of
    _maxsim_dense_kernel), so no load or product is masked; an empty document takes one tile of
    a row at or before num_rows - 1 (D has at least one row) and scores -inf.
    DOCS_PER_PROGRAM is a power of two; TOKENS_I32 and REM_D as _maxsim_dense_kernel's. Shapes
    as _maxsim_dense_kernel (packed)."""
    TOKENS: tl.constexpr = tl.int32 if TOKENS_I32 else tl.int64
    pid = tl.program_id(0)
    pid_qgroup = pid % num_qgroups
    first_doc = (pid // num_qgroups).to(tl.int64) * DOCS_PER_PROGRAM
    ROWS: tl.constexpr = QUERIES_PER_BLOCK * LQ
    offs_b, offs_i, mask_r = _query_rows(pid_qgroup, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
    q_held = _held_query(p_q, offs_b, offs_i, mask_r, dim, stride_qb, stride_qt, stride_qd,
                         BLOCK_D, NUM_D_TILES, REM_D)

    # Tiles of the program's documents (an empty one takes one): the loop's length.
    out_idx = first_doc + tl.arange(0, DOCS_PER_PROGRAM)
    valid, starts, ends = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS)
    lengths = (ends - starts).to(TOKENS)
    num_tiles = tl.sum(tl.where(valid, tl.maximum((lengths + BLOCK_T - 1) // BLOCK_T, 1), 0), 0)

    _, start, end = packed_doc_bounds(p_pids, p_offsets, first_doc, num_out_docs, HAS_PIDS)
    doc_len = (end - start).to(TOKENS)
    _, next_start, next_end = packed_doc_bounds(p_pids, p_offsets, first_doc + 1,
                                                num_out_docs, HAS_PIDS)
    next_len = (next_end - next_start).to(TOKENS)
    slot = 0
    t0 = tl.zeros([], TOKENS)
    row_max = tl.full([ROWS], float("-inf"), tl.float32)
    for _step in range(0, num_tiles):
        # An empty document's start may be num_rows (the last document's end).
        p_doc = p_d + tl.minimum(start, num_rows - 1) * stride_dt
        sim = _tile_sim(q_held, p_q, offs_b, offs_i, mask_r, p_doc, t0, doc_len, dim,
                        stride_qb, stride_qt, stride_qd, stride_dt, stride_dd, ROWS, BLOCK_T,
                        BLOCK_D, NUM_D_TILES, True, EVEN_D, True, INPUT_PRECISION, UPCAST, True,
                        REM_D)
        row_max = maximum_nan(row_max, max_nan(sim, 1))
        done = t0 + BLOCK_T >= doc_len
        if done:
            row_max = tl.where(doc_len > 0, row_max, float("-inf"))
            _store_query_scores(p_out, row_max, mask_r, pid_qgroup, first_doc + slot,
                                num_queries, True, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)
            row_max = tl.full([ROWS], float("-inf"), tl.float32)
        # The next tile's document: this one again, or the next, whose successor is read now.
        ahead = first_doc + slot + 2
        _after_valid, after_start, after_end = packed_doc_bounds(
            p_pids, p_offsets, ahead,
            tl.where(done & (slot + 2 < DOCS_PER_PROGRAM), num_out_docs, 0), HAS_PIDS)
        start = tl.where(done, next_start, start)
        doc_len = tl.where(done, next_len, doc_len)
        next_start = tl.where(done, after_start, next_start)
        next_len = tl.where(done, (after_end - after_start).to(TOKENS), next_len)
        slot = slot + done.to(tl.int32)
        t0 = tl.where(done, 0, t0 + BLOCK_T)


@triton.jit
def _maxsim_packed_slots_kernel(
    p_q, p_d, p_offsets, p_pids, p_query_lengths, p_order, p_out,
    num_out_docs, num_queries, Lq, dim,
    stride_qb, stride_qt, stride_qd,
    stride_dt, stride_dd,
    stride_ob, stride_on,
    num_qgroups,
    HAS_PIDS: tl.constexpr, HAS_QUERY_LENGTHS: tl.constexpr,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    SLOT_T: tl.constexpr, DOCS_PER_TILE: tl.constexpr,
    BLOCK_D: tl.constexpr, NUM_D_TILES: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, REPEAT_ROWS: tl.constexpr = False,
    TOKENS_I32: tl.constexpr = False, HAS_ORDER: tl.constexpr = False,
):
    """Packed documents side by side: one tile holds DOCS_PER_TILE documents, SLOT_T tokens of
    each ([DOCS_PER_TILE * SLOT_T, BLOCK_D] rows gathered from their own offsets), so one
    tensor-core product scores several short documents, the query block is loaded once for all
    of them, and the loop over token chunks is a plain software-pipelined stream. Rows past a
    document's length are masked (never fetched) and are -inf in the max; with REPEAT_ROWS they
    load the document's last row again instead (no select per product; _maxsim_dense_kernel).
    TOKENS_I32: every document's length fits int32 (token positions in 32-bit compares; rows
    are still addressed from 64-bit starts). HAS_ORDER: order, int64 [M], a permutation of the
    output positions 0..M-1; the tiles take the documents in that order (the host's by length,
    so a tile's documents end together) and each score is stored at its own position.

    Shapes as _maxsim_dense_kernel (packed, optional pids); out: fp32 [B, M]."""
    pid = tl.program_id(0)
    pid_qblock = pid % num_qgroups
    pid_docs = pid // num_qgroups
    BLOCK_R: tl.constexpr = DOCS_PER_TILE * SLOT_T

    offs_g = pid_docs.to(tl.int64) * DOCS_PER_TILE + tl.arange(0, DOCS_PER_TILE)
    mask_g = offs_g < num_out_docs
    if HAS_ORDER:
        offs_g = tl.load(p_order + offs_g, mask=mask_g, other=0)  # output positions
    if HAS_PIDS:
        docs = tl.load(p_pids + offs_g, mask=mask_g, other=0).to(tl.int64)
    else:
        docs = offs_g
    starts = tl.load(p_offsets + docs, mask=mask_g, other=0)
    # [DOCS_PER_TILE]; an end before its start is an empty document (packed_doc_bounds).
    lengths = tl.maximum(tl.load(p_offsets + docs + 1, mask=mask_g, other=0) - starts, 0)
    if TOKENS_I32:
        lengths = lengths.to(tl.int32)
    max_len = tl.max(lengths, axis=0)

    # Row r of a tile is token (r % SLOT_T) of the tile's document r // SLOT_T.
    offs_r = tl.arange(0, BLOCK_R)
    row_start = tl.reshape(tl.broadcast_to(starts[:, None], [DOCS_PER_TILE, SLOT_T]), [BLOCK_R])
    row_len = tl.reshape(tl.broadcast_to(lengths[:, None], [DOCS_PER_TILE, SLOT_T]), [BLOCK_R])
    row_tok = offs_r % SLOT_T

    offs_b, offs_i, mask_q = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
    best = tl.full([QUERIES_PER_BLOCK * LQ, DOCS_PER_TILE], float("-inf"), tl.float32)
    for t0 in range(0, max_len, SLOT_T):
        tok = t0 + row_tok
        if REPEAT_ROWS:
            tok = tl.minimum(tok, tl.maximum(row_len - 1, 0))  # masked: empty documents only
        mask_row = tok < row_len
        sim = tl.zeros([QUERIES_PER_BLOCK * LQ, BLOCK_R], tl.float32)
        for k in range(NUM_D_TILES):
            q_tile = _load_query_tile(p_q, offs_b, offs_i, mask_q, k * BLOCK_D, dim,
                                      stride_qb, stride_qt, stride_qd, BLOCK_D)
            offs_d = k * BLOCK_D + tl.arange(0, BLOCK_D)
            p_tile = p_d + (row_start + tok)[:, None] * stride_dt + offs_d[None, :] * stride_dd
            # [BLOCK_R, BLOCK_D]: rows of DOCS_PER_TILE documents, each row a contiguous load.
            d_tile = tl.load(p_tile, mask=mask_row[:, None] & (offs_d[None, :] < dim), other=0.0)
            # [BLOCK_Q, BLOCK_D] @ [BLOCK_D, BLOCK_R] -> [BLOCK_Q, BLOCK_R]
            sim += tile_dot(q_tile, d_tile, INPUT_PRECISION, UPCAST)
        if not REPEAT_ROWS:
            sim = tl.where(mask_row[None, :], sim, float("-inf"))
        # [BLOCK_Q, DOCS_PER_TILE, SLOT_T] -> max over each document's tokens.
        chunk_max = max_nan(tl.reshape(sim, [QUERIES_PER_BLOCK * LQ, DOCS_PER_TILE, SLOT_T]), 2)
        best = maximum_nan(best, chunk_max)
    if REPEAT_ROWS:
        best = tl.where(lengths[None, :] > 0, best, float("-inf"))

    # where(), not a multiply: 0 * -inf is NaN for an empty document.
    contrib = tl.where(mask_q[:, None], best, 0.0)
    scores = tl.sum(tl.reshape(contrib, [QUERIES_PER_BLOCK, LQ, DOCS_PER_TILE]), axis=1)
    offs_qb = pid_qblock * QUERIES_PER_BLOCK + tl.arange(0, QUERIES_PER_BLOCK)
    tl.store(p_out + offs_qb[:, None] * stride_ob + offs_g[None, :] * stride_on, scores,
             mask=(offs_qb[:, None] < num_queries) & mask_g[None, :])
