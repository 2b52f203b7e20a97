"""Fused MaxSim over product-quantization codes, exact to the codec.

    score[b, n] = sum_i max_t <Q[b, i], x_t>,   x_t = s_t * (c[code_t] + concat_m codebooks[m, pq_t[m]])

where the centroid term is present when the PQ codes quantize PLAID residuals (CENTROID_TABLE)
and s_t is a per-token inverse norm when one is given (PRECOMPUTED_NORMS), else 1.

Why not per-query lookup tables in shared memory. The textbook PQ scorer builds, per query token,
a table LUT[m, k] = <q_m, codebooks[m, k]> and sums M table entries per (query token, doc
token). For ColBERT shapes that is the slower design on an H200:
* Table traffic. Per document token it reads M entries for each of the Lq query tokens:
  M * Lq * 2 B = 1 KB at M = 16, Lq = 32, and it adds them on the CUDA cores (M * Lq adds). The
  tables for one 32-token query are 16 * 256 * 32 * 2 B = 256 KB (M = 16): more than an SM's
  shared memory, so they would be tiled over query tokens and the codes re-read per tile.
* Triton cannot index shared memory at run-time addresses; a table gather is a global load
  served by L1, one lane per entry.
That design is kernels/maxsim_pq_lut.py (``PQConfig(scoring="lut")``), timed beside this one
(experiments/profile_kernels.py, H200, 100k documents of mean 70 tokens, one 32-token query):
1.09 ms at its best (M = 16, 32-row tiles) against 0.51 ms here, 2.20 against 0.62 at M = 32
(results/compressed/h200-wide-gathers). This kernel instead decodes
the document tile in registers and lets the tensor cores do the arithmetic: per token it gathers
the M sub-vectors of the codebook (d * 2 B = 256 B in total, 4x less than the tables; the whole
codebook is 256 * d * 2 B = 64 KB at d = 128, held in L1/L2 for the whole kernel) with one
vectorised load of d/M contiguous elements per sub-quantizer, and multiplies the [BLOCK_T, d] tile
by the query block with tl.dot. HBM traffic is M bytes per token (plus 4 for a centroid code and 4
for an inverse norm in residual mode). 8-byte codebook words (GATHER_BYTES = 8) halve the
gathers of 4-byte ones: 0.61 -> 0.51 ms at M = 16 (results/compressed/h200-wide-gathers).
16-byte words (GATHER_BYTES = 16) are one gather per 8-dimension sub-vector; their weights are
laid out in the fp16 operand's register order and the query columns permuted to match
(_to_gather16_order), so the words need no shuffles between lanes.

What bounds it on an H200 is latency, not HBM or L1 bandwidth (results/compressed/
h200-hold-query). Nsight Compute had put L1/TEX at 94 % (DRAM 4 %), but 40 M of those
wavefronts were the query operand, read back from shared memory by ldmatrix before every product
with 2-way bank conflicts. Held in registers instead (HOLD_QUERY, _hold_as_first_operand) L1/TEX
fell to 56 % and the time did not move. Nor did it when the codebook words came in the products'
register order (_decode_pq_words: 351 -> 215 instructions per M = 16 tile body, 0.397 ->
0.387 ms at the same cap), nor when two skewed codebook copies took the gathers out of bank
conflicts (_skewed_slot: L1/TEX 84 -> 62 %, 0.374 -> 0.382 ms; results/compressed/
h200-register-order). The default at M = 16 (one 128-column chunk, 16-byte words, query held,
tiles reduced as they come, 128 registers) ran 366 us under Nsight Compute: 16 one-warp
programs per SM, issue on 24 % of cycles, a warp's instructions 17 cycles apart, 7.5 of them
waiting on loads. What gained was hiding load latency: code words a tile ahead
(PIPELINE_CODES, the M = 16 default since: 0.388 -> 0.349 ms; bench 0.347). Hiding the rest
(STREAM_TILES with DECODE_AHEAD, _score_pq_stream: the wait on loads 4.3 -> 1.3 cycles per
issued instruction) left the time at 0.35 ms: what then bounds it is the L1 data pipe, 82-91 %
busy with the wavefronts of the codebook gathers (about 23 distinct sectors per warp-wide
16-byte gather of random codes), while L1 banks are 11 % busy (Nsight Compute,
results/compressed/h200-tile-stream). Fewer wavefronts per token, not more overlap, is what
is left: the codebook served by shared-memory banks to many warps at once.

The codebook in shared memory (PTX_LOADS == PTX_FROM_SHARED, PQConfig.shared_codebook, opt-in):
shared-memory banks serve a warp's gathers in a few wavefronts where L1 takes one per line.
Triton code cannot index shared memory at run-time addresses, so the copy
(_stage_codebook_in_shared) and the gathers (_ptx_load_shared) are inline PTX at an address
past Triton's own buffers, which the host reserves at launch (ops/launch.prepare_shared_buffer).
On the H200 it is slower: every program needs its own 64 KB copy, so 3 one-warp programs fit an
SM (1.007 ms against 0.415), and programs of 4 or 8 warps split each tile's products between
warps and ran 1.3-2.9 ms. At 3 warps per SM a staged warp issued every 6.6 cycles, against 9.8
for the same shape through L1 at 12 warps. One copy shared by independent warps, each with its
own documents, is kernels/maxsim_pq_warps.py (PQConfig.independent_warps): exact, and in Triton
3.6 no faster (0.351 against 0.356 ms) for the instructions its per-warp streams add.
The same design without that overhead is a CUDA kernel, kernels/maxsim_pq_mma.cu
(PQConfig(scoring="mma"), the default where it applies: d = 128 as M = 16 on a GPU): 0.200 ms
(results/compressed/h200-pq-mma).
The codebooks are rounded to Q's dtype once per call on the host, so the result equals MaxSim
over the codec's decoded vectors within that rounding.

Tile layout: a [BLOCK_T, M_BLOCK, DSUB_PAD] gather (sub-quantizer m, element k of its sub-vector)
reshapes to [BLOCK_T, M_BLOCK * DSUB_PAD]; the query tile is loaded with the same (m, k) ->
m * DSUB + k mapping and zeros where k >= DSUB or m >= M, so a sub-dimension that is not a power
of two (d = 96, M = 16: DSUB = 6) needs no padding in memory.

Word gathers (WORD_GATHER: 16-bit codebooks, an even power-of-two DSUB, whole chunks of a
multiple of 4 sub-quantizers, 4-byte aligned code rows). The code bytes are read as int32 words
and each word is broadcast over the 4 * DSUB / 2 codebook words its 4 codes select, so a
[BLOCK_T, M_BLOCK * DSUB / 2] tensor of codebook word offsets is built with one shift, one mask
and one multiply-add per word; each codebook word holds two fp16 weights, split by bitcast (the
residual kernel's pair decode, with a 64 KB table instead of a 64 B one). With PTX_LOADS the code
and codebook words are read by inline-PTX loads, elementwise ops that take the tensor-core
operand's layout, so no document tile crosses shared memory (kernels/maxsim_residual.
_ptx_load_words).

Grid and tiles as in the residual kernel: documents are walked in full BLOCK_T tiles (unmasked,
an elementwise running max reduced once per document) and then BLOCK_T_TAIL tiles; PERSISTENT
launches a fixed grid whose programs take chunks of DOCS_PER_PROGRAM documents from an atomic
counter.

Masking as everywhere: a token past its document's end is -inf, a query row past its length adds
0; an empty document scores -inf, an empty query 0.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import (packed_doc_bounds, prefetch_rows_l2, tile_dot,
                                             unpack_16bit_word_pair, unpack_16bit_weights)
from tilemaxsim_plaid.kernels.maxsim_dense import _query_rows, _store_query_scores
from tilemaxsim_plaid.kernels.maxsim_residual import _ptx_load_words

# PQ codes are bytes: 256 centroids per sub-quantizer, 4 codes per 32-bit word.
CODEBOOK_SIZE = tl.constexpr(256)
CODES_PER_WORD = tl.constexpr(4)
# PTX_LOADS values: code and codebook words by tl.load (0), by inline PTX from global memory
# (1), or by inline PTX with the codebook staged in shared memory once per program (2,
# _stage_codebook_in_shared).
PTX_FROM_GLOBAL = tl.constexpr(1)
PTX_FROM_SHARED = tl.constexpr(2)
# 16-byte codebook words staged per step of _stage_codebook_in_shared.
STAGE_WORDS = tl.constexpr(512)


@triton.jit
def _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, kd, stride_qb, stride_qt, stride_qd,
                        num_subquantizers, M_BLOCK: tl.constexpr, DSUB: tl.constexpr,
                        DSUB_PAD: tl.constexpr):
    """[BLOCK_Q, M_BLOCK * DSUB_PAD] query columns in the order of a decoded PQ tile."""
    offs_m = kd * M_BLOCK + tl.arange(0, M_BLOCK)
    offs_k = tl.arange(0, DSUB_PAD)
    offs_d = tl.reshape(offs_m[:, None] * DSUB + offs_k[None, :], [M_BLOCK * DSUB_PAD])
    mask_d = tl.reshape((offs_m[:, None] < num_subquantizers) & (offs_k[None, :] < DSUB),
                        [M_BLOCK * DSUB_PAD])
    return tl.load(p_q + offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt
                   + offs_d[None, :] * stride_qd,
                   mask=mask_r[:, None] & mask_d[None, :], other=0.0)


@triton.constexpr_function
def _paired_gather_order(cols, gather_bytes, hold_query):
    """Whether a decoded chunk of cols columns takes the 16-byte words' column order: 16-byte
    words, or 8-byte ones gathered in pairs that cover the same 8 dimensions (whole 32-column
    groups) in one-warp programs with the query held (with more warps triton 3.6 fails to
    compile the pairs' split: "Illegal shared layout" in TritonGPUOptimizeDotOperands)."""
    return gather_bytes == 16 or (gather_bytes == 8 and hold_query and cols % 32 == 0)


@triton.jit
def _to_gather16_order(b_q, ROWS: tl.constexpr, COLS: tl.constexpr, GATHER_BYTES: tl.constexpr,
                       HOLD_QUERY: tl.constexpr):
    """[ROWS, COLS] query columns in dimension order -> the column order of a tile decoded from
    16-byte codebook words, or 8-byte ones in pairs (_decode_pq_words): with G = COLS / 32
    groups, dimension 8 (G t + g) + 4a + 2h + b goes to column 32g + 16h + 4t + 2a + b. A
    register permutation; other gather widths: unchanged."""
    if _paired_gather_order(COLS, GATHER_BYTES, HOLD_QUERY):
        b_q = tl.reshape(b_q, [ROWS, 4, COLS // 32, 2, 2, 2])  # [row, t, g, a, h, b]
        b_q = tl.reshape(tl.permute(b_q, (0, 2, 4, 1, 3, 5)), [ROWS, COLS])
    return b_q


@triton.jit
def _swap_operand_column_bits(x, ROWS: tl.constexpr, COLS: tl.constexpr, INVERSE: tl.constexpr):
    """x with its column index c relabelled: in each 16-column block, bits (b3 b2 b1 b0) of c
    become (b2 b1 b3 b0) (INVERSE: back). A register permutation: see _hold_as_first_operand."""
    x = tl.reshape(x, [ROWS, COLS // 16, 2, 2, 2, 2])  # [row, block, b3, b2, b1, b0]
    if INVERSE:
        x = tl.permute(x, (0, 1, 4, 2, 3, 5))
    else:
        x = tl.permute(x, (0, 1, 3, 4, 2, 5))
    return tl.reshape(x, [ROWS, COLS])


@triton.jit
def _hold_as_first_operand(b_q, ROWS: tl.constexpr, COLS: tl.constexpr, UPCAST: tl.constexpr):
    """b_q, unchanged in value, computed so that the compiler holds it in registers in the
    tensor cores' first-operand layout for the whole program.

    A loop-invariant query chunk given to tl.dot as it is gets staged in shared memory and read
    back with ldmatrix before every product (Triton sinks operand loads into the loop to save
    registers): 16 ldmatrix per 32-token tile of this kernel, 40 M shared-memory wavefronts on
    the H200 with 2-way bank conflicts (Nsight Compute, results/compressed/h200-hold-query/run1).
    Here the chunk is first multiplied by the identity (exact: one nonzero term per sum), which
    puts it in the accumulator layout, and an accumulator converts to a first operand without
    shared memory. That conversion is a register renaming only when the lanes agree: in a
    16-column block the accumulator's lanes own column bits 1-2 and the (kWidth 4) operand's
    bits 2-3, so the column bits are relabelled on the way in and back on the way out
    (_swap_operand_column_bits), both register permutations. One warp: with more, the two
    products split rows over warps differently (ops/pq._hold_query)."""
    eye = tl.arange(0, ROWS)[:, None] == tl.arange(0, ROWS)[None, :]
    b_in = _swap_operand_column_bits(b_q, ROWS, COLS, True)
    if UPCAST:
        held = tl.dot(eye.to(tl.float32), b_in.to(tl.float32), input_precision="ieee")
    else:
        held = tl.dot(eye.to(b_q.dtype), b_in)
    return _swap_operand_column_bits(held.to(b_q.dtype), ROWS, COLS, False)


@triton.jit
def _ptx_load_indexed(p_words, idx, WORD_BYTES: tl.constexpr):
    """WORD_BYTES-byte words (4, 8 or 16) at ``p_words + idx * WORD_BYTES`` (p_words: int32)
    through the read-only path (L1 evict-last), by inline PTX, in the layout of ``idx``: one
    int32, or a tuple of WORD_BYTES / 4 int32 (lowest first) from one vector load. The address
    is formed inside the asm from one base pointer and the 32-bit index, so the compiler holds
    an index per element, not a 64-bit pointer: half the registers for a tile of gathers in
    flight. The parts are 32-bit registers, the width of the tensor cores' fp16 pairs: 64-bit
    parts cost 8 shifts and byte permutes per 16-byte word to repack (sm_90 SASS)."""
    base = p_words + tl.zeros(idx.shape, tl.int32)
    if WORD_BYTES == 16:
        words = tl.inline_asm_elementwise(
            "{ .reg .u64 a; mul.wide.u32 a, $5, 16; add.u64 a, a, $4; "
            "ld.global.nc.L1::evict_last.v4.b32 {$0, $1, $2, $3}, [a]; }",
            "=r,=r,=r,=r,l,r", [base, idx], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
    elif WORD_BYTES == 8:
        words = tl.inline_asm_elementwise(
            "{ .reg .u64 a; mul.wide.u32 a, $3, 8; add.u64 a, a, $2; "
            "ld.global.nc.L1::evict_last.v2.b32 {$0, $1}, [a]; }",
            "=r,=r,l,r", [base, idx], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        words = tl.inline_asm_elementwise(
            "{ .reg .u64 a; mul.wide.u32 a, $2, 4; add.u64 a, a, $1; "
            "ld.global.nc.L1::evict_last.b32 $0, [a]; }",
            "=r,l,r", [base, idx], dtype=tl.int32, is_pure=True, pack=1)
    return words


@triton.jit
def _shared_address(byte_offset):
    """The shared-memory address byte_offset bytes past the start of the program's dynamic
    shared memory (PTX ``global_smem``, where Triton places its own buffers; the host launches
    with room for the codebook past them, ops/launch.prepare_shared_buffer)."""
    return tl.inline_asm_elementwise("{ .reg .u32 a; mov.u32 a, global_smem; add.u32 $0, a, $1; }",
                                     "=r,r", [byte_offset], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _stage_codebook_in_shared(p_book_words, book_address, num_words16):
    """Copies the codebook's num_words16 16-byte words (p_book_words: int64, two per word) to
    shared memory at book_address, then waits for the whole program. Shared memory is indexed
    at run-time addresses only through inline PTX, so both the store and the gathers
    (_ptx_load_shared) are asm."""
    for w0 in range(0, num_words16, STAGE_WORDS):
        offs_w = w0 + tl.arange(0, STAGE_WORDS)
        mask_w = offs_w < num_words16
        low = tl.load(p_book_words + 2 * offs_w, mask=mask_w, other=0)
        high = tl.load(p_book_words + 2 * offs_w + 1, mask=mask_w, other=0)
        # The result is a placeholder: asm needs one, and is_pure=False keeps the store.
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p st.shared.v2.b64 [$1], {$3, $4}; "
            "mov.u32 $0, 0; }",
            "=r,r,r,l,l", [book_address + offs_w * 16, mask_w.to(tl.int32), low, high],
            dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _ptx_load_shared(book_address, idx, WORD_BYTES: tl.constexpr):
    """WORD_BYTES-byte codebook words ``book[idx]`` from shared memory (_stage_codebook_in_shared)
    in the layout of idx, in 32-bit parts as _ptx_load_indexed. Shared-memory banks serve a
    warp's gathers by bank, not by 128-byte line as L1 does."""
    address = book_address + idx * WORD_BYTES
    if WORD_BYTES == 16:
        words = tl.inline_asm_elementwise(
            "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", [address],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    elif WORD_BYTES == 8:
        words = tl.inline_asm_elementwise("ld.shared.v2.b32 {$0, $1}, [$2];", "=r,=r,r",
                                          [address], dtype=(tl.int32, tl.int32), is_pure=True,
                                          pack=1)
    else:
        words = tl.inline_asm_elementwise("ld.shared.b32 $0, [$1];", "=r,r", [address],
                                          dtype=tl.int32, is_pure=True, pack=1)
    return words


@triton.jit
def _load_book_word(p_book_words, idx, WORD_BYTES: tl.constexpr, PTX_LOADS: tl.constexpr):
    """Codebook word idx (WORD_BYTES bytes) as 32-bit parts, lowest first (_ptx_load_indexed):
    from shared memory, by inline PTX from global memory, or by tl.load (the interpreter)."""
    if PTX_LOADS == PTX_FROM_SHARED:
        words = _ptx_load_shared(p_book_words, idx, WORD_BYTES)
    elif PTX_LOADS:
        words = _ptx_load_indexed(p_book_words, idx, WORD_BYTES)
    elif WORD_BYTES == 16:
        p_word = p_book_words + 4 * idx
        words = (tl.load(p_word, eviction_policy="evict_last"),
                 tl.load(p_word + 1, eviction_policy="evict_last"),
                 tl.load(p_word + 2, eviction_policy="evict_last"),
                 tl.load(p_word + 3, eviction_policy="evict_last"))
    elif WORD_BYTES == 8:
        p_word = p_book_words + 2 * idx
        words = (tl.load(p_word, eviction_policy="evict_last"),
                 tl.load(p_word + 1, eviction_policy="evict_last"))
    else:
        words = tl.load(p_book_words + idx, eviction_policy="evict_last")
    return words


@triton.jit
def _load_pq_code_words(kd, offs_t, mask_t, p_code_words, stride_pw, BLOCK_T: tl.constexpr,
                        M_BLOCK: tl.constexpr, MASKED: tl.constexpr, PTX_LOADS: tl.constexpr):
    """[BLOCK_T, M_BLOCK / 4] int32 code words (4 codes each) of sub-quantizers
    kd * M_BLOCK .. (kd + 1) * M_BLOCK of tokens offs_t (0 where masked), streamed once."""
    CODE_WORDS: tl.constexpr = M_BLOCK // CODES_PER_WORD
    offs_u = kd * CODE_WORDS + tl.arange(0, CODE_WORDS)
    p_units = p_code_words + offs_t.to(tl.int64)[:, None] * stride_pw + offs_u[None, :]
    if PTX_LOADS:
        words = _ptx_load_words(p_units, tl.broadcast_to(mask_t[:, None], [BLOCK_T, CODE_WORDS]),
                                MASKED)
    else:
        words = tl.load(p_units, mask=mask_t[:, None], other=0, eviction_policy="evict_first")
    return words


@triton.jit
def _skewed_slot(kd, code, local_sub, BLOCK_T: tl.constexpr, M_BLOCK: tl.constexpr):
    """16-byte slot of sub-quantizer kd * M_BLOCK + local_sub's entry ``code`` in the codebook
    laid out as two skewed copies (BOOK_COPIES = 2, ops/pq.skewed_codebook; 8-dimension
    sub-vectors, 16-byte words, the query held). code: [BLOCK_T, U, 4]; local_sub: [U, 4].

    A warp's 16-byte gather is served a quarter-warp at a time, 8 lanes that are here 2 tokens
    (the operand's row pairs: tokens of either parity) times the 4 lanes of a row, which
    gather sub-quantizers G t + g (t = 0 .. 3, G = M_BLOCK / 4; _decode_pq_words). An entry's
    16-byte bank group is its slot mod 8: with the codebook as it is, code mod 8, random, so a
    quarter-warp's 8 gathers collide in a bank group about 2.5 ways. Here copy p (tokens of
    parity p) puts sub-quantizer m's entries in bank group m // G + 4p, so the 8 gathers of a
    quarter-warp fall in 8 different bank groups whatever the codes."""
    G: tl.constexpr = M_BLOCK // 4
    parity = (tl.arange(0, BLOCK_T) % 2)[:, None, None]
    slot = 8 * (code * G + (local_sub % G)[None, :, :]) + (local_sub // G)[None, :, :]
    return slot + 4 * parity + kd * (2 * CODEBOOK_SIZE * M_BLOCK)


@triton.jit
def _gather_pq_words(kd, words, p_book_words, BLOCK_T: tl.constexpr, M_BLOCK: tl.constexpr,
                     DSUB: tl.constexpr, PTX_LOADS: tl.constexpr, GATHER_BYTES: tl.constexpr,
                     HOLD_QUERY: tl.constexpr, BOOK_COPIES: tl.constexpr):
    """The codebook words of sub-quantizers kd * M_BLOCK .. (kd + 1) * M_BLOCK selected by
    their code words (_load_pq_code_words), read as GATHER_BYTES-byte words (4 bytes: 2
    weights each; 8: 4, half the gathers; 16: 8, in the operand's column order), as four
    32-bit parts p0 .. p3 (_load_book_word; parts a word width does not have repeat p0) for
    _assemble_pq_weights. Apart from the weights so that a caller can hold the loaded
    registers a tile ahead (DECODE_AHEAD) without a layout of their own."""
    CODE_WORDS: tl.constexpr = M_BLOCK // CODES_PER_WORD
    BOOK_WORDS: tl.constexpr = DSUB // (GATHER_BYTES // 2)  # codebook words per sub-vector
    PER_CODE_WORD: tl.constexpr = CODES_PER_WORD * BOOK_WORDS
    offs_u = kd * CODE_WORDS + tl.arange(0, CODE_WORDS)
    # Column group k of a code word: byte k // BOOK_WORDS, codebook word k % BOOK_WORDS.
    offs_k = tl.arange(0, PER_CODE_WORD)
    byte = offs_k // BOOK_WORDS
    code = (words[:, :, None] >> (8 * byte)[None, None, :]) & (CODEBOOK_SIZE - 1)
    sub = offs_u[:, None] * CODES_PER_WORD + byte[None, :]  # [CODE_WORDS, PER_CODE_WORD]
    if BOOK_COPIES == 2:
        idx = tl.reshape(_skewed_slot(kd, code, sub - kd * M_BLOCK, BLOCK_T, M_BLOCK),
                         [BLOCK_T, M_BLOCK])
    else:
        base = sub * (CODEBOOK_SIZE * BOOK_WORDS) + offs_k[None, :] % BOOK_WORDS
        idx = tl.reshape(code * BOOK_WORDS + base[None, :, :], [BLOCK_T, M_BLOCK * BOOK_WORDS])
    # [BLOCK_T, M_BLOCK * BOOK_WORDS]: the whole codebook is 64 KB at d = 128, L1-resident.
    if _paired_gather_order(M_BLOCK * DSUB, GATHER_BYTES, HOLD_QUERY):
        # Eight weights per gather (16-byte words) or per two gathers of adjacent 8-byte words,
        # as 32-bit parts p0 .. p3 (dimensions 2j, 2j + 1 of the eight in pj).
        if GATHER_BYTES == 16:
            p0, p1, p2, p3 = _load_book_word(p_book_words, idx, 16, PTX_LOADS)
        else:
            SPANS: tl.constexpr = M_BLOCK * BOOK_WORDS // 2
            idx_first, idx_second = tl.split(tl.reshape(idx, [BLOCK_T, SPANS, 2]))
            p0, p1 = _load_book_word(p_book_words, idx_first, 8, PTX_LOADS)
            p2, p3 = _load_book_word(p_book_words, idx_second, 8, PTX_LOADS)
    elif GATHER_BYTES == 8:
        p0, p1 = _load_book_word(p_book_words, idx, 8, PTX_LOADS)
        p2 = p0
        p3 = p0
    else:
        p0 = _load_book_word(p_book_words, idx, 4, PTX_LOADS)
        p1 = p0
        p2 = p0
        p3 = p0
    return p0, p1, p2, p3


@triton.jit
def _assemble_pq_weights(p0, p1, p2, p3, dot_dtype: tl.constexpr, BLOCK_T: tl.constexpr,
                         M_BLOCK: tl.constexpr, DSUB: tl.constexpr, GATHER_BYTES: tl.constexpr,
                         HOLD_QUERY: tl.constexpr):
    """[BLOCK_T, M_BLOCK * DSUB] weights from the parts _gather_pq_words read."""
    if _paired_gather_order(M_BLOCK * DSUB, GATHER_BYTES, HOLD_QUERY):
        # Columns in the fp16 operand's register order (kWidth 4: a lane holds 4 adjacent
        # columns of each 16-column block): with G 32-column groups, eight-weight span
        # s = G t + g gives p0 and p2 to columns 32g + 4t .. 32g + 4t+3 and p1 and p3 to
        # 32g + 16 + 4t .. 32g + 16 + 4t+3. So each product takes two adjacent registers
        # (p0, p1), (p2, p3) as a load wrote them: no shuffle, no move (sm_90 SASS; 64-bit parts
        # or other orders cost 4-8 moves or byte permutes per span). And the lane of column
        # 4t holds spans G t .. G t + G - 1, adjacent sub-quantizers, so it reads its codes from
        # as few code words as hold them (one per token at M = 16) instead of one per span.
        # The query columns are read in that order (_to_gather16_order).
        GROUPS: tl.constexpr = M_BLOCK * DSUB // 32
        low = tl.reshape(unpack_16bit_word_pair(p0, p2, dot_dtype), [BLOCK_T, 4, GROUPS, 4])
        high = tl.reshape(unpack_16bit_word_pair(p1, p3, dot_dtype), [BLOCK_T, 4, GROUPS, 4])
        weights = tl.permute(tl.join(low, high), (0, 2, 4, 1, 3))  # [T, g, half, t, 4]
    elif GATHER_BYTES == 8:
        weights = unpack_16bit_word_pair(p0, p1, dot_dtype)
    else:
        weights = unpack_16bit_weights(p0, dot_dtype, 2)
    return tl.reshape(weights, [BLOCK_T, M_BLOCK * DSUB])


@triton.jit
def _decode_pq_words(kd, words, p_book_words, dot_dtype: tl.constexpr, BLOCK_T: tl.constexpr,
                     M_BLOCK: tl.constexpr, DSUB: tl.constexpr, PTX_LOADS: tl.constexpr,
                     GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr,
                     BOOK_COPIES: tl.constexpr):
    """[BLOCK_T, M_BLOCK * DSUB] weights of sub-quantizers kd * M_BLOCK .. (kd + 1) * M_BLOCK,
    from their code words (_load_pq_code_words) and the codebook words they select."""
    p0, p1, p2, p3 = _gather_pq_words(kd, words, p_book_words, BLOCK_T, M_BLOCK, DSUB,
                                      PTX_LOADS, GATHER_BYTES, HOLD_QUERY, BOOK_COPIES)
    return _assemble_pq_weights(p0, p1, p2, p3, dot_dtype, BLOCK_T, M_BLOCK, DSUB, GATHER_BYTES,
                                HOLD_QUERY)


@triton.jit
def _pq_tile_scores(
    t0, t_end, next_words, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col,
    p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
    num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
    BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, M_BLOCK: tl.constexpr,
    NUM_M_BLOCKS: tl.constexpr, DSUB: tl.constexpr, DSUB_PAD: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, FULL: tl.constexpr,
    WORD_GATHER: tl.constexpr, PTX_LOADS: tl.constexpr, GATHER_BYTES: tl.constexpr,
    HOLD_QUERY: tl.constexpr, PIPELINE_CODES: tl.constexpr, BOOK_COPIES: tl.constexpr,
    ahead_emb, DECODE_AHEAD: tl.constexpr,
):
    """[BLOCK_Q, BLOCK_T] scores of tokens t0 .. t0+BLOCK_T (those at or past t_end are -inf).
    FULL: the caller guarantees t0 + BLOCK_T <= t_end, so nothing is masked. With WORD_GATHER
    p_pq_codes and p_codebooks point to int32 words and stride_pt counts words. The products
    accumulate with the query first when it is held (HOLD_QUERY), else with the decoded tile
    first, [BLOCK_T, BLOCK_Q], transposed on return (a relabelling of registers).
    PIPELINE_CODES (word gathers, one chunk): the tile's code words are next_words, loaded by
    the caller; otherwise next_words is unused. DECODE_AHEAD (the same, and the tile stream):
    the decoded tile is ahead_emb, gathered by the caller while the tile before it was
    multiplied; otherwise ahead_emb is unused."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    if FULL:
        # A constant-true mask folds away: unpredicated loads, no -inf select.
        mask_t = tl.full([BLOCK_T], 1, tl.int1)
    else:
        mask_t = offs_t < t_end
    if CENTROID_TABLE:
        codes = tl.load(p_centroid_codes + offs_t, mask=mask_t, other=0,
                        eviction_policy="evict_first").to(tl.int64)
        # [BLOCK_T, BLOCK_Q]: row codes[t] of S = centroids @ Q^T
        p_rows_s = p_centroid_scores + codes[:, None] * stride_sc + offs_col[None, :]
        mask_s = mask_t[:, None] & mask_col[None, :]
        # A tl.load, not inline PTX in the accumulator's layout: one 2- or 4-byte load per
        # element there took the fp16 kernel from 0.50 to 0.64 ms (H200), the layout
        # conversion through shared memory is cheaper.
        acc = tl.load(p_rows_s, mask=mask_s, other=0.0,
                      eviction_policy="evict_last").to(tl.float32)
        if HOLD_QUERY:
            acc = tl.trans(acc)
    elif HOLD_QUERY:
        acc = tl.zeros([BLOCK_Q, BLOCK_T], tl.float32)
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_Q], tl.float32)
    offs_k = tl.arange(0, DSUB_PAD)
    for kd in tl.static_range(NUM_M_BLOCKS):
        if WORD_GATHER and DECODE_AHEAD:
            b_emb = ahead_emb  # gathered one tile ahead by the caller
        elif WORD_GATHER:
            if PIPELINE_CODES:
                words = next_words  # loaded one tile ahead by the caller
            else:
                words = _load_pq_code_words(kd, offs_t, mask_t, p_pq_codes, stride_pt, BLOCK_T,
                                            M_BLOCK, not FULL, PTX_LOADS)
            b_emb = _decode_pq_words(kd, words, p_codebooks, b_q0.dtype, BLOCK_T, M_BLOCK, DSUB,
                                     PTX_LOADS, GATHER_BYTES, HOLD_QUERY, BOOK_COPIES)
        else:
            offs_m = kd * M_BLOCK + tl.arange(0, M_BLOCK)
            mask_m = offs_m < num_subquantizers
            # [BLOCK_T, M_BLOCK] one byte per sub-quantizer
            b_codes = tl.load(p_pq_codes + offs_t[:, None] * stride_pt + offs_m[None, :],
                              mask=mask_t[:, None] & mask_m[None, :], other=0,
                              eviction_policy="evict_first").to(tl.int32)
            # [BLOCK_T, M_BLOCK, DSUB_PAD]: codebooks[m, code] sub-vectors, contiguous in k
            rows = offs_m[None, :, None] * CODEBOOK_SIZE + b_codes[:, :, None]
            p_sub = p_codebooks + (rows * DSUB + offs_k[None, None, :])
            b_sub = tl.load(p_sub, mask=mask_m[None, :, None] & (offs_k[None, None, :] < DSUB),
                            other=0.0, eviction_policy="evict_last")
            b_emb = tl.reshape(b_sub, [BLOCK_T, M_BLOCK * DSUB_PAD]).to(b_q0.dtype)
        if kd == 0:
            b_q = b_q0
        elif kd == 1:
            b_q = b_q1
        else:
            b_q = _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, kd, stride_qb, stride_qt,
                                      stride_qd, num_subquantizers, M_BLOCK, DSUB, DSUB_PAD)
            b_q = _to_gather16_order(b_q, BLOCK_Q, M_BLOCK * DSUB_PAD, GATHER_BYTES,
                                     HOLD_QUERY)
        if HOLD_QUERY:
            acc += tile_dot(b_q, b_emb, INPUT_PRECISION, UPCAST)
        else:
            acc += tile_dot(b_emb, b_q, INPUT_PRECISION, UPCAST)
    if PRECOMPUTED_NORMS:
        inv_norm = tl.load(p_inv_norms + offs_t, mask=mask_t, other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
        if HOLD_QUERY:
            acc = acc * inv_norm[None, :]
        else:
            acc = acc * inv_norm[:, None]
    if HOLD_QUERY:
        scores = tl.where(mask_t[None, :], acc, float("-inf"))
    else:
        scores = tl.trans(tl.where(mask_t[:, None], acc, float("-inf")))
    return scores


@triton.jit
def _score_pq_document(
    out_idx, pid_qblock, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col,
    p_q, p_pq_codes, p_offsets, p_pids, p_codebooks, p_centroid_codes, p_inv_norms,
    p_centroid_scores, p_out,
    num_out_docs, num_queries, num_subquantizers,
    stride_qb, stride_qt, stride_qd, stride_pt, stride_sc, stride_ob, stride_on,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_T_TAIL: tl.constexpr,
    M_BLOCK: tl.constexpr, NUM_M_BLOCKS: tl.constexpr, DSUB: tl.constexpr,
    DSUB_PAD: tl.constexpr, HAS_PIDS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    WORD_GATHER: tl.constexpr, PTX_LOADS: tl.constexpr, PREFETCH: tl.constexpr,
    GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr, PIPELINE_CODES: tl.constexpr,
    REDUCE_PER_TILE: tl.constexpr, BOOK_COPIES: tl.constexpr,
):
    """Scores the out_idx-th scored document against the program's query block and stores them
    (nothing for a slot past the last document). PREFETCH 1: first asks L2 for the document's
    code rows, so tiles after the first find them there; 2: the next document's as well."""
    valid_doc, start, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS)
    code_row_bytes = stride_pt * 4 if WORD_GATHER else stride_pt
    if PREFETCH >= 1:
        prefetch_rows_l2(p_pq_codes, start + BLOCK_T, end, code_row_bytes, 32)
    if PREFETCH >= 2:
        _, next_start, next_end = packed_doc_bounds(p_pids, p_offsets, out_idx + 1, num_out_docs,
                                                    HAS_PIDS)
        prefetch_rows_l2(p_pq_codes, next_start, next_end, code_row_bytes, 32)
    full_end = start + ((end - start) // BLOCK_T) * BLOCK_T
    # Main tiles are full: an elementwise running max, reduced over tokens once per document;
    # with REDUCE_PER_TILE each tile is reduced as it comes instead (BLOCK_Q * BLOCK_T / 32
    # fewer live registers per lane, a few more shuffles per tile).
    tile_max = tl.full([BLOCK_Q, BLOCK_T], float("-inf"), tl.float32)
    row_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    # With PIPELINE_CODES each full tile's code words are loaded one tile ahead, so the tile
    # does not wait for its HBM read; rows past the document's end are masked. When tails are
    # tiles of BLOCK_T too (at most one per document), the last load is the tail's.
    offs_next = start + tl.arange(0, BLOCK_T)
    next_words = tl.zeros([BLOCK_T, M_BLOCK // CODES_PER_WORD], tl.int32)
    if PIPELINE_CODES:
        next_words = _load_pq_code_words(0, offs_next, offs_next < end, p_pq_codes, stride_pt,
                                         BLOCK_T, M_BLOCK, True, PTX_LOADS)
    for t0 in range(start, full_end, BLOCK_T):
        words = next_words
        if PIPELINE_CODES:
            offs_next = t0 + BLOCK_T + tl.arange(0, BLOCK_T)
            next_words = _load_pq_code_words(0, offs_next, offs_next < end, p_pq_codes,
                                             stride_pt, BLOCK_T, M_BLOCK, True, PTX_LOADS)
        scores = _pq_tile_scores(
            t0, end, words, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col,
            p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
            num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
            BLOCK_T, BLOCK_Q, M_BLOCK, NUM_M_BLOCKS, DSUB, DSUB_PAD, CENTROID_TABLE,
            PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST, True, WORD_GATHER, PTX_LOADS,
            GATHER_BYTES, HOLD_QUERY, PIPELINE_CODES, BOOK_COPIES, b_q0, False)
        if REDUCE_PER_TILE:
            row_max = tl.maximum(row_max, tl.max(scores, axis=1))
        else:
            tile_max = tl.maximum(tile_max, scores)
    if not REDUCE_PER_TILE:
        row_max = tl.max(tile_max, axis=1)
    for t0 in range(full_end, end, BLOCK_T_TAIL):
        scores = _pq_tile_scores(
            t0, end, next_words, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col,
            p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
            num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
            BLOCK_T_TAIL, BLOCK_Q, M_BLOCK, NUM_M_BLOCKS, DSUB, DSUB_PAD, CENTROID_TABLE,
            PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST, False, WORD_GATHER, PTX_LOADS,
            GATHER_BYTES, HOLD_QUERY, PIPELINE_CODES and BLOCK_T_TAIL == BLOCK_T, BOOK_COPIES,
            b_q0, False)
        row_max = tl.maximum(row_max, tl.max(scores, axis=1))
    _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                        valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)


@triton.jit
def _chunk_tiles(first_idx, p_pids, p_offsets, num_out_docs, BLOCK_T: tl.constexpr,
                 DOCS_PER_PROGRAM: tl.constexpr, HAS_PIDS: tl.constexpr):
    """Tiles in the stream of the DOCS_PER_PROGRAM scored documents from first_idx
    (_score_pq_stream; a tensor of first indices gives one count each, kernels/maxsim_pq_warps):
    ceil(length / BLOCK_T) per document, and one for an empty document (a masked tile, so that
    its -inf is stored); none for slots past the last document."""
    num_tiles = 0
    for j in tl.static_range(DOCS_PER_PROGRAM):
        valid, start, end = packed_doc_bounds(p_pids, p_offsets, first_idx + j, num_out_docs,
                                              HAS_PIDS)
        num_tiles += tl.where(valid, tl.maximum(tl.cdiv(end - start, BLOCK_T), 1), 0)
    return num_tiles


@triton.jit
def _next_stream_tile(out_idx, t0, end, p_pids, p_offsets, num_out_docs, BLOCK_T: tl.constexpr,
                      HAS_PIDS: tl.constexpr):
    """The tile after tile (out_idx, t0, end) of a stream: the document's next BLOCK_T tokens,
    else the first tile of the next scored document (empty past the last one)."""
    next_idx = out_idx
    next_t0 = t0 + BLOCK_T
    next_end = end
    if next_t0 >= end:
        next_idx = out_idx + 1
        _, next_t0, next_end = packed_doc_bounds(p_pids, p_offsets, next_idx, num_out_docs,
                                                 HAS_PIDS)
    return next_idx, next_t0, next_end


@triton.jit
def _load_stream_code_words(t0, end, p_pq_codes, stride_pt, BLOCK_T: tl.constexpr,
                            M_BLOCK: tl.constexpr, PTX_LOADS: tl.constexpr):
    """Code words of a stream tile's tokens t0 .. t0 + BLOCK_T (0 at or past end)."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    return _load_pq_code_words(0, offs_t, offs_t < end, p_pq_codes, stride_pt, BLOCK_T, M_BLOCK,
                               True, PTX_LOADS)


@triton.jit
def _reduce_stream_tile(scores, row_max, out_idx, t0, end, p_out, mask_r, pid_qblock,
                        num_out_docs, num_queries, stride_ob, stride_on, BLOCK_T: tl.constexpr,
                        LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr):
    """Folds a stream tile's [BLOCK_Q, BLOCK_T] scores into its document's row maxima; after
    the document's last tile, stores its scores and starts the next document's maxima."""
    row_max = tl.maximum(row_max, tl.max(scores, axis=1))
    if t0 + BLOCK_T >= end:
        _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                            out_idx < num_out_docs, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)
        row_max = tl.full(row_max.shape, float("-inf"), tl.float32)
    return row_max


@triton.jit
def _score_pq_stream(
    pid_qblock, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col,
    p_q, p_pq_codes, p_offsets, p_pids, p_codebooks, p_centroid_codes, p_inv_norms,
    p_centroid_scores, p_out, p_counter,
    num_out_docs, num_queries, num_subquantizers, num_chunks,
    stride_qb, stride_qt, stride_qd, stride_pt, stride_sc, stride_ob, stride_on,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_T: tl.constexpr, M_BLOCK: tl.constexpr, DSUB: tl.constexpr,
    DOCS_PER_PROGRAM: tl.constexpr, HAS_PIDS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, PTX_LOADS: tl.constexpr,
    GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr, BOOK_COPIES: tl.constexpr,
    DECODE_AHEAD: tl.constexpr,
):
    """Scores each chunk of DOCS_PER_PROGRAM documents this persistent program takes as one
    stream of BLOCK_T-token tiles (word gathers, one chunk of sub-quantizers), instead of
    document by document (_score_pq_document).

    Why. Walking a document at a time, each document starts with a tile whose code words were
    not loaded ahead and ends with a tail tile in a loop of its own, and MS MARCO-like documents
    (mean 70 tokens) are two or three tiles long. Here the tile after the current one, which may
    be the next document's first, has its code words loaded while the current one is
    multiplied, and a document's last tile is a masked tile like any other. DECODE_AHEAD goes
    one step further: the next tile's codebook words are gathered before the current tile's
    products, so their L1 latency hides behind the products instead of in front of them (a
    second tile of gathered words in registers: meant for 16-token tiles), and code words are
    loaded two tiles ahead.

    The stream is a counted loop per chunk (_chunk_tiles), not one loop over every chunk:
    the gathered words are held across iterations, and triton 3.6 gives a value held across a
    while loop a layout of its own (sm_90 SASS: 64 byte permutes, shared-memory stores and
    ldmatrix per tile to convert it back), while across a for loop it keeps the gathers'
    layout. The pipeline restarts at each chunk, and the tiles looked ahead past a chunk's
    last are loaded and not used."""
    chunk = tl.atomic_add(p_counter, 1, sem="relaxed")
    while chunk < num_chunks:
        out_idx = chunk.to(tl.int64) * DOCS_PER_PROGRAM
        num_tiles = _chunk_tiles(out_idx, p_pids, p_offsets, num_out_docs, BLOCK_T,
                                 DOCS_PER_PROGRAM, HAS_PIDS)
        _, t0, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS)
        words = _load_stream_code_words(t0, end, p_pq_codes, stride_pt, BLOCK_T, M_BLOCK,
                                        PTX_LOADS)
        row_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        if DECODE_AHEAD:
            p0, p1, p2, p3 = _gather_pq_words(0, words, p_codebooks, BLOCK_T, M_BLOCK, DSUB,
                                              PTX_LOADS, GATHER_BYTES, HOLD_QUERY, BOOK_COPIES)
            next_idx, next_t0, next_end = _next_stream_tile(out_idx, t0, end, p_pids, p_offsets,
                                                            num_out_docs, BLOCK_T, HAS_PIDS)
            words = _load_stream_code_words(next_t0, next_end, p_pq_codes, stride_pt, BLOCK_T,
                                            M_BLOCK, PTX_LOADS)
        for _ in range(num_tiles):
            # (out_idx, t0, end): the tile multiplied now. With DECODE_AHEAD its words are
            # p0 .. p3 and `words` are the code words of (next_idx, next_t0, next_end);
            # otherwise `words` are its own code words.
            if DECODE_AHEAD:
                after_idx, after_t0, after_end = _next_stream_tile(
                    next_idx, next_t0, next_end, p_pids, p_offsets, num_out_docs, BLOCK_T,
                    HAS_PIDS)
                after_words = _load_stream_code_words(after_t0, after_end, p_pq_codes,
                                                      stride_pt, BLOCK_T, M_BLOCK, PTX_LOADS)
                n0, n1, n2, n3 = _gather_pq_words(0, words, p_codebooks, BLOCK_T, M_BLOCK, DSUB,
                                                  PTX_LOADS, GATHER_BYTES, HOLD_QUERY,
                                                  BOOK_COPIES)
                emb = _assemble_pq_weights(p0, p1, p2, p3, b_q0.dtype, BLOCK_T, M_BLOCK, DSUB,
                                           GATHER_BYTES, HOLD_QUERY)
            else:
                next_idx, next_t0, next_end = _next_stream_tile(
                    out_idx, t0, end, p_pids, p_offsets, num_out_docs, BLOCK_T, HAS_PIDS)
                after_words = _load_stream_code_words(next_t0, next_end, p_pq_codes, stride_pt,
                                                      BLOCK_T, M_BLOCK, PTX_LOADS)
                emb = b_q0  # unused
            scores = _pq_tile_scores(
                t0, end, words, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col,
                p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
                num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
                BLOCK_T, BLOCK_Q, M_BLOCK, 1, DSUB, DSUB, CENTROID_TABLE, PRECOMPUTED_NORMS,
                INPUT_PRECISION, UPCAST, False, True, PTX_LOADS, GATHER_BYTES, HOLD_QUERY, True,
                BOOK_COPIES, emb, DECODE_AHEAD)
            row_max = _reduce_stream_tile(scores, row_max, out_idx, t0, end, p_out, mask_r,
                                          pid_qblock, num_out_docs, num_queries, stride_ob,
                                          stride_on, BLOCK_T, LQ, QUERIES_PER_BLOCK)
            out_idx, t0, end, words = next_idx, next_t0, next_end, after_words
            if DECODE_AHEAD:
                p0, p1, p2, p3 = n0, n1, n2, n3
                next_idx, next_t0, next_end = after_idx, after_t0, after_end
        chunk = tl.atomic_add(p_counter, 1, sem="relaxed")


@triton.jit
def _maxsim_pq_kernel(
    p_q, p_pq_codes, p_offsets, p_pids, p_codebooks, p_centroid_codes, p_inv_norms,
    p_centroid_scores, p_query_lengths, p_out, p_counter,
    num_out_docs, num_queries, Lq, num_subquantizers, num_qblocks, num_chunks,
    stride_qb, stride_qt, stride_qd, stride_pt, stride_sc, stride_ob, stride_on,
    book_shared_offset,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_T_TAIL: tl.constexpr,
    M_BLOCK: tl.constexpr, NUM_M_BLOCKS: tl.constexpr, DSUB: tl.constexpr,
    DSUB_PAD: tl.constexpr, DOCS_PER_PROGRAM: tl.constexpr,
    HAS_PIDS: tl.constexpr, HAS_QUERY_LENGTHS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    WORD_GATHER: tl.constexpr, PTX_LOADS: tl.constexpr, PERSISTENT: tl.constexpr,
    PREFETCH: tl.constexpr, GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr,
    PIPELINE_CODES: tl.constexpr, REDUCE_PER_TILE: tl.constexpr, BOOK_COPIES: tl.constexpr,
    STREAM_TILES: tl.constexpr, DECODE_AHEAD: tl.constexpr,
):
    """Q: [B, Lq, d = M*DSUB] (strides q*); pq_codes: [T, M] uint8 (row stride stride_pt) or,
    with WORD_GATHER, its int32 words (stride_pt in words); offsets: int64 [N+1]; pids: [M']
    (else 0..M'-1); codebooks: [M, 256, DSUB] contiguous, Q's dtype (int32 words with
    WORD_GATHER); centroid_codes: [T] and S: [C, B*Lq] fp32 (row stride stride_sc) when
    CENTROID_TABLE; inv_norms: [T] when PRECOMPUTED_NORMS; query_lengths: [B]; out: fp32 [B, M'];
    counter (PERSISTENT, one query block): int32 [1], zero at launch, the next chunk of
    DOCS_PER_PROGRAM documents to score, of num_chunks. HOLD_QUERY (one warp, 16-bit Q, BLOCK_Q
    and the chunk width multiples of 16): the first two query chunks are held as the products' first
    operand (_hold_as_first_operand). PIPELINE_CODES (word gathers, one chunk of sub-quantizers):
    a full tile's code words are loaded while the tile before it is scored. REDUCE_PER_TILE:
    each full tile's scores are reduced over its tokens as they come (_score_pq_document).
    PTX_LOADS (word gathers): 0, PTX_FROM_GLOBAL or PTX_FROM_SHARED; with the last the codebook
    is staged at book_shared_offset bytes into dynamic shared memory (the host reserves it:
    ops/launch.prepare_shared_buffer), otherwise book_shared_offset is unused. BOOK_COPIES 2
    (16-byte words of 8-dimension sub-vectors, the query held): codebooks is the layout of
    ops/pq.skewed_codebook, two copies of 2 * M * 256 slots in all (_skewed_slot); else 1.
    STREAM_TILES (persistent, word gathers, one chunk of sub-quantizers): the program's documents
    are one stream of BLOCK_T-token tiles (_score_pq_stream; BLOCK_T_TAIL, PIPELINE_CODES,
    REDUCE_PER_TILE and PREFETCH are then unused), with DECODE_AHEAD each tile's codebook words
    gathered a tile ahead."""
    pid = tl.program_id(0)
    pid_qblock = pid % num_qblocks
    pid_docs = pid // num_qblocks
    BLOCK_Q: tl.constexpr = QUERIES_PER_BLOCK * LQ

    offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
    offs_col = offs_b * Lq + offs_i
    mask_col = (offs_b < num_queries) & (offs_i < Lq)
    # [BLOCK_Q, M_BLOCK * DSUB_PAD]: the first two chunks stay in registers / shared memory
    # across every tile of the program (d = 128 in 64-column chunks is all of it); later chunks
    # are reloaded per tile from L1/L2.
    b_q0 = _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, 0, stride_qb, stride_qt, stride_qd,
                               num_subquantizers, M_BLOCK, DSUB, DSUB_PAD)
    b_q0 = _to_gather16_order(b_q0, BLOCK_Q, M_BLOCK * DSUB_PAD, GATHER_BYTES, HOLD_QUERY)
    if HOLD_QUERY:
        b_q0 = _hold_as_first_operand(b_q0, BLOCK_Q, M_BLOCK * DSUB_PAD, UPCAST)
    if NUM_M_BLOCKS >= 2:
        b_q1 = _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, 1, stride_qb, stride_qt,
                                   stride_qd, num_subquantizers, M_BLOCK, DSUB, DSUB_PAD)
        b_q1 = _to_gather16_order(b_q1, BLOCK_Q, M_BLOCK * DSUB_PAD, GATHER_BYTES,
                                    HOLD_QUERY)
        if HOLD_QUERY:
            b_q1 = _hold_as_first_operand(b_q1, BLOCK_Q, M_BLOCK * DSUB_PAD, UPCAST)
    else:
        b_q1 = b_q0
    if WORD_GATHER:
        p_pq_codes = p_pq_codes.to(tl.pointer_type(tl.int32))
        if PTX_LOADS == PTX_FROM_SHARED:
            # From here on the codebook is a shared-memory address, not a pointer.
            book_address = _shared_address(book_shared_offset)
            _stage_codebook_in_shared(p_codebooks.to(tl.pointer_type(tl.int64)), book_address,
                                      num_subquantizers * CODEBOOK_SIZE * DSUB // 8)
            p_codebooks = book_address
        else:
            p_codebooks = p_codebooks.to(tl.pointer_type(tl.int32))

    if STREAM_TILES:
        _score_pq_stream(
            pid_qblock, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col, p_q, p_pq_codes,
            p_offsets, p_pids, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
            p_out, p_counter, num_out_docs, num_queries, num_subquantizers, num_chunks,
            stride_qb, stride_qt, stride_qd, stride_pt, stride_sc, stride_ob, stride_on, LQ,
            QUERIES_PER_BLOCK, BLOCK_Q, BLOCK_T, M_BLOCK, DSUB, DOCS_PER_PROGRAM, HAS_PIDS,
            CENTROID_TABLE, PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST, PTX_LOADS, GATHER_BYTES,
            HOLD_QUERY, BOOK_COPIES, DECODE_AHEAD)
    elif PERSISTENT:
        # Chunks of documents go to whichever program asks next (ops/residual.py explains why).
        chunk = tl.atomic_add(p_counter, 1, sem="relaxed")
        while chunk < num_chunks:
            for doc_step in range(DOCS_PER_PROGRAM):
                _score_pq_document(
                    chunk.to(tl.int64) * DOCS_PER_PROGRAM + doc_step, pid_qblock, b_q0, b_q1,
                    offs_b, offs_i, mask_r, offs_col, mask_col, p_q, p_pq_codes, p_offsets,
                    p_pids, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores, p_out,
                    num_out_docs, num_queries, num_subquantizers, stride_qb, stride_qt,
                    stride_qd, stride_pt, stride_sc, stride_ob, stride_on, LQ,
                    QUERIES_PER_BLOCK, BLOCK_Q, BLOCK_T, BLOCK_T_TAIL, M_BLOCK, NUM_M_BLOCKS,
                    DSUB, DSUB_PAD, HAS_PIDS, CENTROID_TABLE, PRECOMPUTED_NORMS,
                    INPUT_PRECISION, UPCAST, WORD_GATHER, PTX_LOADS, PREFETCH, GATHER_BYTES,
                    HOLD_QUERY, PIPELINE_CODES, REDUCE_PER_TILE, BOOK_COPIES)
            chunk = tl.atomic_add(p_counter, 1, sem="relaxed")
    else:
        for doc_step in range(DOCS_PER_PROGRAM):
            _score_pq_document(
                pid_docs.to(tl.int64) * DOCS_PER_PROGRAM + doc_step, pid_qblock, b_q0, b_q1, offs_b,
                offs_i, mask_r, offs_col, mask_col, p_q, p_pq_codes, p_offsets, p_pids,
                p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores, p_out,
                num_out_docs, num_queries, num_subquantizers, stride_qb, stride_qt,
                stride_qd, stride_pt, stride_sc, stride_ob, stride_on, LQ,
                QUERIES_PER_BLOCK, BLOCK_Q, BLOCK_T, BLOCK_T_TAIL, M_BLOCK, NUM_M_BLOCKS,
                DSUB, DSUB_PAD, HAS_PIDS, CENTROID_TABLE, PRECOMPUTED_NORMS,
                INPUT_PRECISION, UPCAST, WORD_GATHER, PTX_LOADS, PREFETCH, GATHER_BYTES,
                HOLD_QUERY, PIPELINE_CODES, REDUCE_PER_TILE, BOOK_COPIES)
