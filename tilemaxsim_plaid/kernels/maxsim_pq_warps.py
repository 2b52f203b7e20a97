"""Fused MaxSim over PQ codes with the codebook shared by independent warps.

The one-warp kernel (kernels/maxsim_pq.py) gathers each token's M codebook sub-vectors through
L1. On an H200 that is what bounds it: Nsight Compute puts the L1 data pipe 82-91 % busy with
the gathers' wavefronts (about 23 distinct sectors per warp-wide 16-byte gather of random
codes) while L1 banks are 11 % busy, and hiding the gathers' latency did not move the time
(results/compressed/h200-tile-stream). Shared memory serves the same gathers by bank: a quarter
warp's eight 16-byte reads take one wavefront when they fall in eight bank groups (the skewed
copies of ops/pq.skewed_codebook guarantee it) and about 2.5 for random slots.

A copy of the codebook per one-warp program costs occupancy (64 KB each: 3 programs per SM,
1.0 ms; results/compressed/h200-shared-codebook). Here one program of WARPS warps stages the
codebook once and every warp scores its own documents against it: the products are a batched
tl.dot of [WARPS, Lq, d] by [WARPS, d, BLOCK_T], which triton lays out one batch element per warp
(warpsPerCTA = [WARPS, 1, 1]), so a warp's tile and its row maxima never leave the warp. A
program takes chunks of documents; each chunk is cut into one run of consecutive documents per
warp with about as many tiles as the others' (_balanced_warp_runs), and each warp
walks its run as a stream of BLOCK_T-token tiles (a document's last tile masked, an empty
document one masked tile); the loop runs as many tiles as the longest run, and the others idle
through masked tiles.

Measured on the H200 (M = 16, 100k documents of mean 70 tokens, one 32-token query;
results/compressed/h200-tile-stream/run11): exact, and as fast as the one-warp kernel, 0.351
against 0.356 ms at its best (16 warps, chunks of up to 24 or 32 documents per warp, skewed
copies). Chunks of up to 8 documents per warp take 0.460: each chunk restarts the tile pipeline
and pays for its cut; one chunk per program takes 0.396. Nsight Compute: the L1 data pipe is 49 %
busy (91 % for the one-warp kernel), issue 47 %, and the program executes 1.6x the one-warp
kernel's instructions (145 M against 91 M). In the sm_90 SASS of the tile loop (about 280
instructions per 16-token tile, 32 of them tensor-core products):
* each [WARPS] value (a warp's document index, rows, bounds) lives once per layout that uses
  it, and triton recomputes it, loads included, in each: four copies of the next document's
  bounds per tile;
* each tile's row maxima are reduced and summed for the store, and the [WARPS] sums cross
  shared memory to the store's layout: a barrier of all the program's warps per tile.
Token rows and document indices are int32 for that reason (ops/pq.py refuses larger indices):
in 64-bit the loop took 332 instructions and spilled at the 128 registers a 16-warp program
allows (run7: 0.489 ms, 201 M instructions). Runs of a fixed number of documents per warp left
a quarter of the tile slots idle behind the warp with the most tiles (run9: 0.407 ms). Kept
opt-in as the measured form of the shared-codebook design; a kernel that gives each warp its
own document queue and keeps its descriptors in scalar registers (warp specialization, outside
Triton 3.6) is what is left.

Scope: word gathers (16-bit queries, an even power-of-two sub-dimension), all sub-quantizers
in one chunk of at most 128 columns, PQ codes of embeddings (no centroid term), one query per
launch (ops/pq.py refuses the rest). Masking as everywhere: a token past its document's end is
-inf, a query row past its length adds 0; an empty document scores -inf.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import packed_doc_bounds
from tilemaxsim_plaid.kernels.maxsim_pq import (PTX_FROM_SHARED,
                                                _assemble_pq_weights,
                                                _gather_pq_words, _load_pq_code_words,
                                                _load_query_pq_tile, _shared_address,
                                                _stage_codebook_in_shared, _to_gather16_order)


@triton.jit
def _load_warp_code_words(t0, end, p_code_words, stride_pt, BLOCK_T: tl.constexpr,
                          M_BLOCK: tl.constexpr, PTX_LOADS: tl.constexpr):
    """[WARPS * BLOCK_T, M_BLOCK / 4] code words of each warp's tile t0 .. t0 + BLOCK_T
    (0 at or past end), warp-major: _load_pq_code_words over the warps' token rows."""
    ROWS: tl.constexpr = t0.shape[0] * BLOCK_T
    offs_t = t0[:, None] + tl.arange(0, BLOCK_T)[None, :]  # [WARPS, BLOCK_T]
    mask_t = tl.reshape(offs_t < end[:, None], [ROWS])
    return _load_pq_code_words(0, tl.reshape(offs_t, [ROWS]), mask_t, p_code_words, stride_pt,
                               ROWS, M_BLOCK, True, PTX_LOADS)


@triton.jit
def _warp_doc_rows(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS: tl.constexpr):
    """int32 (start, end) token rows of each warp's out_idx-th scored document
    (kernels/common.packed_doc_bounds; empty past the last one)."""
    _, start, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS)
    return start.to(tl.int32), end.to(tl.int32)


@triton.jit
def _balanced_warp_runs(p_pids, p_offsets, first_doc, chunk_docs, num_out_docs,
                        BLOCK_T: tl.constexpr, WARPS: tl.constexpr, CHUNK_BLOCK: tl.constexpr,
                        HAS_PIDS: tl.constexpr):
    """(first document index, tiles) of each warp: the chunk's scored documents first_doc ..
    first_doc + chunk_docs cut into WARPS runs of consecutive documents, warp w's run starting
    at the last document boundary at or before w / WARPS of the chunk's tiles (a document is
    ceil(length / BLOCK_T) tiles, an empty one 1). A run is then at most one document's tiles
    longer than the mean, where runs of a fixed number of documents differ by the spread of
    their lengths; a warp with no run has 0 tiles."""
    offs_c = tl.arange(0, CHUNK_BLOCK)
    idx = first_doc + offs_c
    in_chunk = (offs_c < chunk_docs) & (idx < num_out_docs)
    _, start, end = packed_doc_bounds(p_pids, p_offsets, idx, num_out_docs, HAS_PIDS)
    tiles = tl.where(in_chunk, tl.maximum(tl.cdiv(end - start, BLOCK_T), 1), 0).to(tl.int32)
    tiles_through = tl.cumsum(tiles, axis=0)  # tiles of documents 0 .. j
    total = tl.sum(tiles, axis=0)
    offs_w = tl.arange(0, WARPS)
    # Warp w starts after the documents that end at or before its share w * total / WARPS, and
    # the next warp where its share ends: past the chunk for the last warp (all CHUNK_BLOCK
    # slots, whose trailing ones hold no tiles).
    share_start = (offs_w * total) // WARPS
    share_end = tl.where(offs_w == WARPS - 1, total, ((offs_w + 1) * total) // WARPS)
    first = tl.sum((tiles_through[None, :] <= share_start[:, None]).to(tl.int32), axis=1)
    tiles_before = tl.sum(tl.where(offs_c[None, :] < first[:, None], tiles[None, :], 0), axis=1)
    after = tl.sum((tiles_through[None, :] <= share_end[:, None]).to(tl.int32), axis=1)
    tiles_until = tl.sum(tl.where(offs_c[None, :] < after[:, None], tiles[None, :], 0), axis=1)
    return first_doc + first, tiles_until - tiles_before


# Not specialized on the chunking, so that the launch the host sizes shared memory for
# (ops/launch.prepare_shared_buffer, before the chunks are known) is the one it runs: a
# chunk of one document would otherwise compile a kernel of its own without the codebook's
# bytes reserved.
@triton.jit(do_not_specialize=["num_chunks", "chunk_docs"])
def _maxsim_pq_warps_kernel(
    p_q, p_code_words, p_offsets, p_pids, p_book_words, p_query_lengths, p_out, p_counter,
    num_out_docs, Lq, num_subquantizers, num_chunks, chunk_docs,
    stride_qt, stride_qd, stride_pt, stride_on, book_shared_offset,
    LQ: tl.constexpr, BLOCK_T: tl.constexpr, M_BLOCK: tl.constexpr, DSUB: tl.constexpr,
    WARPS: tl.constexpr, CHUNK_BLOCK: tl.constexpr, HAS_PIDS: tl.constexpr,
    HAS_QUERY_LENGTHS: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    PTX_LOADS: tl.constexpr, GATHER_BYTES: tl.constexpr, BOOK_COPIES: tl.constexpr,
):
    """Q: [1, Lq, d = M*DSUB] (strides q*); code_words: int32 words of [T, M] uint8 codes (row
    stride stride_pt words); offsets: int64 [N+1]; pids: [N'] (else 0..N'-1); book_words: int32
    words of the [M, 256, DSUB] codebook in Q's dtype (or of ops/pq.skewed_codebook's layout,
    BOOK_COPIES = 2); query_lengths: [1]; out: fp32 [1, N'] (stride_on); counter: int32 [1],
    zero at launch: the next chunk of chunk_docs <= CHUNK_BLOCK documents, of num_chunks. With
    PTX_LOADS == PTX_FROM_SHARED the codebook is staged at book_shared_offset bytes into
    dynamic shared memory (ops/launch.prepare_shared_buffer); otherwise (the interpreter) it is
    gathered from global memory by tl.load."""
    D_COLS: tl.constexpr = M_BLOCK * DSUB
    offs_i = tl.arange(0, LQ)
    if HAS_QUERY_LENGTHS:
        q_len = tl.minimum(tl.load(p_query_lengths), Lq)
    else:
        q_len = Lq
    mask_r = offs_i < q_len
    b_q = _load_query_pq_tile(p_q, tl.zeros([LQ], tl.int32), offs_i, mask_r, 0, 0, stride_qt,
                              stride_qd, num_subquantizers, M_BLOCK, DSUB, DSUB)
    b_q = _to_gather16_order(b_q, LQ, D_COLS, GATHER_BYTES, True)
    # Every warp multiplies by the whole query: [WARPS, LQ, D_COLS], one copy per warp.
    b_q = tl.broadcast_to(b_q[None, :, :], [WARPS, LQ, D_COLS])
    p_code_words = p_code_words.to(tl.pointer_type(tl.int32))
    if PTX_LOADS == PTX_FROM_SHARED:
        # From here on the codebook is a shared-memory address, not a pointer.
        book = _shared_address(book_shared_offset)
        _stage_codebook_in_shared(p_book_words.to(tl.pointer_type(tl.int64)), book,
                                  BOOK_COPIES * num_subquantizers * 256 * DSUB // 8)
    else:
        book = p_book_words.to(tl.pointer_type(tl.int32))
    offs_tile = tl.arange(0, BLOCK_T)

    chunk = tl.atomic_add(p_counter, 1, sem="relaxed")
    while chunk < num_chunks:
        # Each warp scores a run of the chunk's documents with about as many tiles as the
        # others'. Indices and token rows are int32 (ops/pq.py checks that they fit): each
        # [WARPS] value is recomputed in every layout that uses it, so its arithmetic is paid
        # several times.
        out_idx, warp_tiles = _balanced_warp_runs(p_pids, p_offsets, chunk * chunk_docs,
                                                  chunk_docs, num_out_docs, BLOCK_T, WARPS,
                                                  CHUNK_BLOCK, HAS_PIDS)
        t0, end = _warp_doc_rows(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS)
        words = _load_warp_code_words(t0, end, p_code_words, stride_pt, BLOCK_T, M_BLOCK,
                                      PTX_LOADS)
        row_max = tl.full([WARPS, LQ], float("-inf"), tl.float32)
        for tile in range(tl.max(warp_tiles).to(tl.int32)):
            active = tile < warp_tiles
            # The warp's next tile: the document's next BLOCK_T tokens, else its next document.
            same_doc = t0 + BLOCK_T < end
            next_idx = tl.where(same_doc, out_idx, out_idx + 1)
            next_start, next_end = _warp_doc_rows(p_pids, p_offsets, next_idx, num_out_docs,
                                                  HAS_PIDS)
            next_t0 = tl.where(same_doc, t0 + BLOCK_T, next_start)
            next_end = tl.where(same_doc, end, next_end)
            next_words = _load_warp_code_words(next_t0, next_end, p_code_words, stride_pt,
                                               BLOCK_T, M_BLOCK, PTX_LOADS)
            # [WARPS * BLOCK_T, D_COLS] weights, then one [BLOCK_T, D_COLS] tile per warp.
            p0, p1, p2, p3 = _gather_pq_words(0, words, book, WARPS * BLOCK_T, M_BLOCK, DSUB,
                                              PTX_LOADS, GATHER_BYTES, True, BOOK_COPIES)
            emb = _assemble_pq_weights(p0, p1, p2, p3, b_q.dtype, WARPS * BLOCK_T, M_BLOCK,
                                       DSUB, GATHER_BYTES, True)
            emb = tl.permute(tl.reshape(emb, [WARPS, BLOCK_T, D_COLS]), (0, 2, 1))
            if UPCAST:  # the interpreter multiplies 16-bit floats as fp32 (kernels/common.tile_dot)
                scores = tl.dot(b_q.to(tl.float32), emb.to(tl.float32),
                                input_precision=INPUT_PRECISION)
            else:
                scores = tl.dot(b_q, emb, input_precision=INPUT_PRECISION)
            in_doc = (t0[:, None] + offs_tile[None, :]) < end[:, None]  # [WARPS, BLOCK_T]
            scores = tl.where(in_doc[:, None, :], scores, float("-inf"))
            row_max = tl.maximum(row_max, tl.max(scores, axis=2))
            # A warp stores after its document's last tile; where(), not a multiply: 0 * -inf
            # is NaN for an empty document.
            last = active & ~same_doc & (out_idx < num_out_docs)
            per_doc = tl.sum(tl.where(mask_r[None, :], row_max, 0.0), axis=1)
            tl.store(p_out + out_idx.to(tl.int64) * stride_on, per_doc, mask=last)
            row_max = tl.where(~same_doc[:, None], float("-inf"), row_max)
            out_idx, t0, end, words = next_idx, next_t0, next_end, next_words
        chunk = tl.atomic_add(p_counter, 1, sem="relaxed")
