"""TileMaxSim dense kernel: exact MaxSim over padded or packed (PLAID) document embeddings.

    score[b, n] = sum_i max_j <Q[b, i], D[n, j]>

One program scores DOCS_PER_PROGRAM documents against Q_BLOCKS_PER_PROGRAM blocks of queries.
A query block stacks QUERIES_PER_BLOCK queries, each padded (in registers only) to LQ rows, so
one tensor-core product scores a document tile against several queries at once. The running
maximum of every query row stays in registers; no similarity matrix is written to memory.

Two ways to walk a document:
* SINGLE_TILE (every document fits one [BLOCK_T, BLOCK_D] tile): the tile is loaded from HBM
  once and then reused from registers/shared memory by every query block of the program
  (cross-query tiling).
* otherwise: tiles of BLOCK_T tokens; the embedding dimension is walked in NUM_D_TILES chunks of
  BLOCK_D (d = 384 is 3 x 128, d = 96 is one masked 128 chunk), so d is never padded in memory.

Masking: a document token at or past the document's length is -inf, so it never wins a max; a
query row past its query's length contributes 0 to the sum. A document of length 0 therefore
scores -inf, and a query of length 0 scores 0.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import tile_dot


@triton.jit
def _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                HAS_QUERY_LENGTHS: tl.constexpr, LQ: tl.constexpr,
                QUERIES_PER_BLOCK: tl.constexpr):
    """Query index, token index and validity of each row of a query block."""
    offs_r = tl.arange(0, QUERIES_PER_BLOCK * LQ)
    offs_b = pid_qblock * QUERIES_PER_BLOCK + offs_r // LQ
    offs_i = offs_r % LQ
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
def _load_doc_tile(p_doc, t0, doc_len, d0, dim, stride_dt, stride_dd,
                   BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_t = t0 + tl.arange(0, BLOCK_T)
    offs_d = d0 + tl.arange(0, BLOCK_D)
    p = p_doc + offs_t[:, None] * stride_dt + offs_d[None, :] * stride_dd
    # [BLOCK_T, BLOCK_D]; masked rows are never fetched, so short documents cost only their bytes.
    return tl.load(p, mask=(offs_t[:, None] < doc_len) & (offs_d[None, :] < dim), other=0.0)


@triton.jit
def _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries, valid_doc,
                        stride_ob, stride_on, LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr):
    # where(), not a multiply: 0 * -inf is NaN for an empty document.
    contrib = tl.where(mask_r, row_max, 0.0)
    per_query = tl.sum(tl.reshape(contrib, [QUERIES_PER_BLOCK, LQ]), axis=1)  # [QUERIES_PER_BLOCK]
    offs_b = pid_qblock * QUERIES_PER_BLOCK + tl.arange(0, QUERIES_PER_BLOCK)
    # A program past the last document stores nothing: no query index is below 0.
    num_stored = tl.where(valid_doc, num_queries, 0)
    tl.store(p_out + offs_b * stride_ob + out_idx * stride_on, per_query, mask=offs_b < num_stored)


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
    DOCS_PER_PROGRAM: tl.constexpr, SINGLE_TILE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Q: [B, Lq, d] (strides q*); D: [N, Ld, d] padded or [T, d] packed (strides d*; stride_dn
    unused when packed); offsets: int64 [N+1] when packed; doc_lengths: [N] when padded (else
    padded_doc_len); pids: [M] documents to score (else 0..M-1); out: fp32 [B, M]."""
    # Query groups vary fastest so the programs reading the same documents run side by side and
    # every document byte after the first read comes from L2.
    pid = tl.program_id(0)
    pid_qgroup = pid % num_qgroups
    pid_docs = pid // num_qgroups

    for doc_step in range(DOCS_PER_PROGRAM):
        out_idx = pid_docs.to(tl.int64) * DOCS_PER_PROGRAM + doc_step
        valid_doc = out_idx < num_out_docs
        # Branch-free on purpose: a program past the end scores an empty document and stores
        # nothing, which keeps this loop software-pipelinable.
        if HAS_PIDS:
            doc = tl.load(p_pids + out_idx, mask=valid_doc, other=0).to(tl.int64)
        else:
            doc = out_idx
        if PACKED:
            start = tl.load(p_offsets + doc, mask=valid_doc, other=0)
            end = tl.load(p_offsets + doc + 1, mask=valid_doc, other=0)
            doc_len = end - start
            p_doc = p_d + start * stride_dt
        else:
            if HAS_DOC_LENGTHS:
                doc_len = tl.load(p_doc_lengths + doc, mask=valid_doc, other=0).to(tl.int64)
            else:
                doc_len = tl.where(valid_doc, padded_doc_len, 0).to(tl.int64)
            p_doc = p_d + doc * stride_dn
        doc_len = tl.where(valid_doc, doc_len, 0)

        if SINGLE_TILE:
            # [BLOCK_T, BLOCK_D]: read from HBM once, reused by every query block below.
            d_tile = _load_doc_tile(p_doc, 0, doc_len, 0, dim, stride_dt, stride_dd, BLOCK_T, BLOCK_D)
            mask_t = tl.arange(0, BLOCK_T) < doc_len
            for qb in tl.static_range(Q_BLOCKS_PER_PROGRAM):
                pid_qblock = pid_qgroup * Q_BLOCKS_PER_PROGRAM + qb
                offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                                     HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
                q_tile = _load_query_tile(p_q, offs_b, offs_i, mask_r, 0, dim,
                                          stride_qb, stride_qt, stride_qd, BLOCK_D)
                # [BLOCK_Q, BLOCK_D] @ [BLOCK_D, BLOCK_T] -> [BLOCK_Q, BLOCK_T]
                sim = tile_dot(q_tile, d_tile, INPUT_PRECISION, UPCAST)
                sim = tl.where(mask_t[None, :], sim, float("-inf"))
                row_max = tl.max(sim, axis=1)
                _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                                    valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)
        else:
            for qb in tl.static_range(Q_BLOCKS_PER_PROGRAM):
                pid_qblock = pid_qgroup * Q_BLOCKS_PER_PROGRAM + qb
                offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                                     HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
                row_max = tl.full([QUERIES_PER_BLOCK * LQ], float("-inf"), tl.float32)
                for t0 in range(0, doc_len, BLOCK_T):
                    sim = tl.zeros([QUERIES_PER_BLOCK * LQ, BLOCK_T], tl.float32)
                    # A dynamic loop (like a GEMM's K loop) so Triton software-pipelines the
                    # loads of the next 128-wide chunk of d behind this chunk's product.
                    for k in range(NUM_D_TILES):
                        q_tile = _load_query_tile(p_q, offs_b, offs_i, mask_r, k * BLOCK_D, dim,
                                                  stride_qb, stride_qt, stride_qd, BLOCK_D)
                        d_tile = _load_doc_tile(p_doc, t0, doc_len, k * BLOCK_D, dim,
                                                stride_dt, stride_dd, BLOCK_T, BLOCK_D)
                        # [BLOCK_Q, BLOCK_D] @ [BLOCK_D, BLOCK_T] -> [BLOCK_Q, BLOCK_T]
                        sim += tile_dot(q_tile, d_tile, INPUT_PRECISION, UPCAST)
                    mask_t = (t0 + tl.arange(0, BLOCK_T)) < doc_len
                    sim = tl.where(mask_t[None, :], sim, float("-inf"))
                    row_max = tl.maximum(row_max, tl.max(sim, axis=1))
                _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                                    valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)


@triton.jit
def _maxsim_packed_stream_kernel(
    p_q, p_d, p_offsets, p_query_lengths, p_out,
    num_docs, num_queries, Lq, dim,
    stride_qb, stride_qt, stride_qd,
    stride_dt, stride_dd,
    stride_ob, stride_on,
    num_qgroups,
    HAS_QUERY_LENGTHS: tl.constexpr,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D_TILES: tl.constexpr,
    DOCS_PER_PROGRAM: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Streaming variant for a whole packed corpus (no pids): one program takes DOCS_PER_PROGRAM
    consecutive documents and walks their tokens as one contiguous stream of full BLOCK_T tiles,
    whatever the document boundaries, so every load is a full coalesced tile and the loop is a
    plain software-pipelined stream. Each tile's columns are assigned to documents by comparing
    token indices with the group's end offsets; a document that runs past a tile carries its
    running maxima into the next one. Same math, masking and output as _maxsim_dense_kernel."""
    pid = tl.program_id(0)
    pid_qblock = pid % num_qgroups
    pid_group = pid // num_qgroups
    first_doc = pid_group.to(tl.int64) * DOCS_PER_PROGRAM
    offs_g = tl.arange(0, DOCS_PER_PROGRAM)
    docs = first_doc + offs_g
    mask_g = docs < num_docs
    group_end = tl.minimum(first_doc + DOCS_PER_PROGRAM, num_docs)
    t_begin = tl.load(p_offsets + first_doc)
    t_end = tl.load(p_offsets + group_end)
    # [DOCS_PER_PROGRAM] end offsets; past the corpus they are t_end, which no token reaches.
    ends = tl.load(p_offsets + docs + 1, mask=mask_g, other=0)
    ends = tl.where(mask_g, ends, t_end)
    starts = tl.load(p_offsets + docs, mask=mask_g, other=0)

    offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)

    # Empty documents own no token, so the stream below never visits them: store their score
    # (-inf, or 0 for a query without tokens) here.
    offs_qb = pid_qblock * QUERIES_PER_BLOCK + tl.arange(0, QUERIES_PER_BLOCK)
    if HAS_QUERY_LENGTHS:
        q_len = tl.load(p_query_lengths + offs_qb, mask=offs_qb < num_queries, other=0)
    else:
        q_len = tl.full([QUERIES_PER_BLOCK], 1, tl.int32) * Lq
    empty_score = tl.where(q_len > 0, float("-inf"), 0.0)
    mask_empty = (offs_qb[:, None] < num_queries) & (mask_g & (ends == starts))[None, :]
    tl.store(p_out + offs_qb[:, None] * stride_ob + docs[None, :] * stride_on,
             empty_score[:, None] + tl.zeros([QUERIES_PER_BLOCK, DOCS_PER_PROGRAM], tl.float32),
             mask=mask_empty)

    open_max = tl.full([QUERIES_PER_BLOCK * LQ], float("-inf"), tl.float32)
    open_doc = first_doc - 1
    for t0 in range(t_begin, t_end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < t_end
        sim = tl.zeros([QUERIES_PER_BLOCK * LQ, BLOCK_T], tl.float32)
        for k in range(NUM_D_TILES):
            q_tile = _load_query_tile(p_q, offs_b, offs_i, mask_r, k * BLOCK_D, dim,
                                      stride_qb, stride_qt, stride_qd, BLOCK_D)
            offs_d = k * BLOCK_D + tl.arange(0, BLOCK_D)
            p_tile = p_d + offs_t[:, None] * stride_dt + offs_d[None, :] * stride_dd
            # [BLOCK_T, BLOCK_D]
            d_tile = tl.load(p_tile, mask=mask_t[:, None] & (offs_d[None, :] < dim), other=0.0)
            # [BLOCK_Q, BLOCK_D] @ [BLOCK_D, BLOCK_T] -> [BLOCK_Q, BLOCK_T]
            sim += tile_dot(q_tile, d_tile, INPUT_PRECISION, UPCAST)
        # [BLOCK_T]: index of the document owning each column = number of documents ending at
        # or before it (empty documents count too, which keeps the index right).
        col_doc = first_doc + tl.sum((ends[None, :] <= offs_t[:, None]).to(tl.int32), axis=1)
        col_doc = tl.where(mask_t, col_doc, group_end)
        doc_lo = tl.min(col_doc, axis=0)
        doc_hi = tl.max(tl.where(mask_t, col_doc, doc_lo), axis=0)
        for doc in range(doc_lo, doc_hi + 1):
            row_max = tl.max(tl.where((col_doc == doc)[None, :], sim, float("-inf")), axis=1)
            row_max = tl.maximum(row_max, tl.where(doc == open_doc, open_max, float("-inf")))
            doc_end = tl.sum(tl.where(docs == doc, ends, 0), axis=0)
            finished = doc_end <= t0 + BLOCK_T
            _store_query_scores(p_out, row_max, mask_r, pid_qblock, doc, num_queries, finished,
                                stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)
            open_max = tl.where(finished, float("-inf"), row_max)
            open_doc = doc
