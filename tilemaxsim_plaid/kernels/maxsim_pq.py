"""Fused MaxSim over product-quantization codes, exact to the codec.

    score[b, n] = sum_i max_t <Q[b, i], x_t>,   x_t = s_t * (c[code_t] + concat_m codebooks[m, pq_t[m]])

where the centroid term is present when the PQ codes quantize PLAID residuals (CENTROID_TABLE)
and s_t is a per-token inverse norm when one is given (PRECOMPUTED_NORMS), else 1.

Design. The document tile is decoded in registers and multiplied by the query block on the
tensor cores: per token the kernel gathers the M sub-vectors the codes select (d * 2 B in all;
the whole codebook, 256 * d * 2 B = 64 KB at d = 128, stays in L1/L2 for the kernel's life) and
reads M bytes of codes from HBM (plus 4 for a centroid code and 4 for an inverse norm). The
textbook alternative, per-query lookup tables summed on the CUDA cores, reads M entries per
query row and token instead (M * Lq * 4 B = 2 KB at M = 16, Lq = 32): that is
kernels/maxsim_pq_lut.py, kept as the baseline. The codebooks are rounded to Q's dtype once per
call on the host, so the result equals MaxSim over the codec's decoded vectors within that
rounding. The same decode with one codebook shared by all warps of a block in shared memory is
the CUDA kernel kernels/maxsim_pq_mma.cu (Triton cannot index shared memory at run-time
addresses); this kernel covers every other shape, dtype and the CPU interpreter.

Tile layout: a [BLOCK_T, M_BLOCK, DSUB_PAD] gather (sub-quantizer m, element k of its sub-vector)
reshapes to [BLOCK_T, M_BLOCK * DSUB_PAD]; the query tile is loaded with the same (m, k) ->
m * DSUB + k mapping and zeros where k >= DSUB or m >= M, so a sub-dimension that is not a power
of two (d = 96, M = 16: DSUB = 6) needs no padding in memory. Sub-quantizers come in chunks of
M_BLOCK (at most 128 decoded columns per product); the first two query chunks stay loaded for
the whole program, later ones are reloaded per tile.

Word gathers (WORD_GATHER: 16-bit codebooks, an even power-of-two DSUB, whole chunks of a
multiple of 4 sub-quantizers, 4-byte aligned code rows): the code bytes are read as int32 words
and each word is broadcast over the codebook words its 4 codes select, so the tile's gather
offsets cost one shift, one mask and one multiply-add per word. A codebook word is GATHER_BYTES
wide: 4 (two weights), 8 (four) or 16 (eight: one gather per 8-dimension sub-vector). 16-byte
words, and 8-byte ones gathered in pairs, come in the fp16 operand's register order, and the
query columns are permuted to match (_to_gather16_order), so the words need no shuffles between
lanes. With PTX_LOADS (on a GPU) code and codebook words are read by inline-PTX loads,
elementwise ops that take the tensor-core operand's layout, so no document tile crosses shared
memory (kernels/maxsim_residual._ptx_load_words); the interpreter reads them with tl.load.

HOLD_QUERY (one warp, 16-bit Q): the query chunks are held in registers in the products' first-
operand layout (_hold_as_first_operand) instead of being read back from shared memory before
every product. PIPELINE_CODES: each full tile's code words are loaded while the tile before it
is scored, hiding their HBM latency. REDUCE_PER_TILE: each full tile is reduced over its tokens
as it comes, fewer live registers under a register cap.

Grid: documents are walked in full BLOCK_T tiles (unmasked, an elementwise running max reduced
once per document) and then BLOCK_T_TAIL tiles; PERSISTENT launches a fixed grid whose programs
take chunks of DOCS_PER_PROGRAM documents from an atomic counter.

Masking as everywhere: a token past its document's end is -inf, a query row past its length adds
0; an empty document scores -inf, an empty query 0.
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import (max_nan, maximum_nan, packed_doc_bounds, tile_dot,
                                             unpack_16bit_word_pair, unpack_16bit_weights)
from tilemaxsim_plaid.kernels.maxsim_dense import _query_rows, _store_query_scores
from tilemaxsim_plaid.kernels.maxsim_residual import _ptx_load_words

# PQ codes are bytes: 256 centroids per sub-quantizer, 4 codes per 32-bit word.
CODEBOOK_SIZE = tl.constexpr(256)
CODES_PER_WORD = tl.constexpr(4)


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


@triton.jit
def _to_gather16_order(b_q, ROWS: tl.constexpr, COLS: tl.constexpr, GATHER_BYTES: tl.constexpr,
                       HOLD_QUERY: tl.constexpr):
    """[ROWS, COLS] query columns in dimension order -> the column order of a tile decoded from
    16-byte codebook words, or 8-byte ones in pairs (_decode_pq_words): with G = COLS / 32
    groups, dimension 8 (G t + g) + 4a + 2h + b goes to column 32g + 16h + 4t + 2a + b. A
    register permutation; other gather widths: unchanged.

    That order is taken by 16-byte words, and by 8-byte ones gathered in pairs that cover the
    same 8 dimensions (whole 32-column groups) in one-warp programs with the query held (with
    more warps triton 3.6 fails to compile the pairs' split: "Illegal shared layout" in
    TritonGPUOptimizeDotOperands); _decode_pq_words tests the same condition (written out in
    both: triton before 3.4 calls no host function from kernel code)."""
    if (GATHER_BYTES == 16) or ((GATHER_BYTES == 8 and HOLD_QUERY) and COLS % 32 == 0):
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
    registers): 16 ldmatrix per 32-token tile of this kernel, with 2-way bank conflicts.
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
def _load_book_word(p_book_words, idx, WORD_BYTES: tl.constexpr, PTX_LOADS: tl.constexpr):
    """Codebook word idx (WORD_BYTES bytes) as 32-bit parts, lowest first (_ptx_load_indexed):
    by inline PTX on a GPU, or by tl.load (the interpreter)."""
    if PTX_LOADS:
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
                                0, MASKED, False)
    else:
        words = tl.load(p_units, mask=mask_t[:, None], other=0, eviction_policy="evict_first")
    return words


@triton.jit
def _decode_pq_words(kd, words, p_book_words, dot_dtype: tl.constexpr, BLOCK_T: tl.constexpr,
                     M_BLOCK: tl.constexpr, DSUB: tl.constexpr, PTX_LOADS: tl.constexpr,
                     GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr):
    """[BLOCK_T, M_BLOCK * DSUB] weights of sub-quantizers kd * M_BLOCK .. (kd + 1) * M_BLOCK,
    from their code words (_load_pq_code_words) and the GATHER_BYTES-byte codebook words they
    select (4 bytes: 2 weights each; 8: 4, half the gathers; 16: 8, in the operand's column
    order), read as 32-bit parts p0 .. p3 (_load_book_word; parts a word width does not have
    repeat p0)."""
    CODE_WORDS: tl.constexpr = M_BLOCK // CODES_PER_WORD
    BOOK_WORDS: tl.constexpr = DSUB // (GATHER_BYTES // 2)  # codebook words per sub-vector
    PER_CODE_WORD: tl.constexpr = CODES_PER_WORD * BOOK_WORDS
    offs_u = kd * CODE_WORDS + tl.arange(0, CODE_WORDS)
    # Column group k of a code word: byte k // BOOK_WORDS, codebook word k % BOOK_WORDS.
    offs_k = tl.arange(0, PER_CODE_WORD)
    byte = offs_k // BOOK_WORDS
    code = (words[:, :, None] >> (8 * byte)[None, None, :]) & (CODEBOOK_SIZE - 1)
    sub = offs_u[:, None] * CODES_PER_WORD + byte[None, :]  # [CODE_WORDS, PER_CODE_WORD]
    base = sub * (CODEBOOK_SIZE * BOOK_WORDS) + offs_k[None, :] % BOOK_WORDS
    # [BLOCK_T, M_BLOCK * BOOK_WORDS] codebook word indices: the whole codebook is L1-resident.
    idx = tl.reshape(code * BOOK_WORDS + base[None, :, :], [BLOCK_T, M_BLOCK * BOOK_WORDS])
    COLS: tl.constexpr = M_BLOCK * DSUB
    if (GATHER_BYTES == 16) or ((GATHER_BYTES == 8 and HOLD_QUERY) and COLS % 32 == 0):
        # The 16-byte words' column order (_to_gather16_order).
        # Eight weights per gather (16-byte words) or per two gathers of adjacent 8-byte words,
        # as 32-bit parts p0 .. p3 (dimensions 2j, 2j + 1 of the eight in pj).
        if GATHER_BYTES == 16:
            p0, p1, p2, p3 = _load_book_word(p_book_words, idx, 16, PTX_LOADS)
        else:
            SPANS: tl.constexpr = M_BLOCK * BOOK_WORDS // 2
            idx_first, idx_second = tl.split(tl.reshape(idx, [BLOCK_T, SPANS, 2]))
            p0, p1 = _load_book_word(p_book_words, idx_first, 8, PTX_LOADS)
            p2, p3 = _load_book_word(p_book_words, idx_second, 8, PTX_LOADS)
        # Columns in the fp16 operand's register order (kWidth 4: a lane holds 4 adjacent
        # columns of each 16-column block): with G 32-column groups, eight-weight span
        # s = G t + g gives p0 and p2 to columns 32g + 4t .. 32g + 4t+3 and p1 and p3 to
        # 32g + 16 + 4t .. 32g + 16 + 4t+3. So each product takes two adjacent registers
        # (p0, p1), (p2, p3) as a load wrote them: no shuffle, no move (64-bit parts or other
        # orders cost moves or byte permutes per span). And the lane of column 4t holds spans
        # G t .. G t + G - 1, adjacent sub-quantizers, so it reads its codes from as few code
        # words as hold them (one per token at M = 16) instead of one per span. The query
        # columns are read in that order (_to_gather16_order).
        GROUPS: tl.constexpr = M_BLOCK * DSUB // 32
        low = tl.reshape(unpack_16bit_word_pair(p0, p2, dot_dtype), [BLOCK_T, 4, GROUPS, 4])
        high = tl.reshape(unpack_16bit_word_pair(p1, p3, dot_dtype), [BLOCK_T, 4, GROUPS, 4])
        weights = tl.permute(tl.join(low, high), (0, 2, 4, 1, 3))  # [T, g, half, t, 4]
    elif GATHER_BYTES == 8:
        p0, p1 = _load_book_word(p_book_words, idx, 8, PTX_LOADS)
        weights = unpack_16bit_word_pair(p0, p1, dot_dtype)
    else:
        p0 = _load_book_word(p_book_words, idx, 4, PTX_LOADS)
        weights = unpack_16bit_weights(p0, dot_dtype, 2)
    return tl.reshape(weights, [BLOCK_T, M_BLOCK * DSUB])


@triton.jit
def _pq_chunk_product(
    kd, acc, b_q, next_words, offs_t, mask_t, p_pq_codes, p_codebooks, num_subquantizers,
    stride_pt, BLOCK_T: tl.constexpr, M_BLOCK: tl.constexpr, DSUB: tl.constexpr,
    DSUB_PAD: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    FULL: tl.constexpr, WORD_GATHER: tl.constexpr, PTX_LOADS: tl.constexpr,
    GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr, PIPELINE_CODES: tl.constexpr,
):
    """acc plus the product of query chunk b_q with the decoded sub-quantizers kd * M_BLOCK ..
    (kd + 1) * M_BLOCK of tokens offs_t (as _pq_tile_scores lays them out)."""
    if WORD_GATHER:
        if PIPELINE_CODES:
            words = next_words  # loaded one tile ahead by the caller
        else:
            words = _load_pq_code_words(kd, offs_t, mask_t, p_pq_codes, stride_pt, BLOCK_T,
                                        M_BLOCK, not FULL, PTX_LOADS)
        b_emb = _decode_pq_words(kd, words, p_codebooks, b_q.dtype, BLOCK_T, M_BLOCK, DSUB,
                                 PTX_LOADS, GATHER_BYTES, HOLD_QUERY)
    else:
        offs_k = tl.arange(0, DSUB_PAD)
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
        b_emb = tl.reshape(b_sub, [BLOCK_T, M_BLOCK * DSUB_PAD]).to(b_q.dtype)
    if HOLD_QUERY:
        acc += tile_dot(b_q, b_emb, INPUT_PRECISION, UPCAST)
    else:
        acc += tile_dot(b_emb, b_q, INPUT_PRECISION, UPCAST)
    return acc


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
    HOLD_QUERY: tl.constexpr, PIPELINE_CODES: tl.constexpr,
):
    """[BLOCK_Q, BLOCK_T] scores of tokens t0 .. t0+BLOCK_T (those at or past t_end are -inf).
    FULL: the caller guarantees t0 + BLOCK_T <= t_end, so nothing is masked. With WORD_GATHER
    p_pq_codes and p_codebooks point to int32 words and stride_pt counts words. The products
    accumulate with the query first when it is held (HOLD_QUERY), else with the decoded tile
    first, [BLOCK_T, BLOCK_Q], transposed on return (a relabelling of registers).
    PIPELINE_CODES: the tile's code words are next_words, loaded by the caller; otherwise
    next_words is unused."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    if FULL:
        # A constant-true mask folds away: unpredicated loads, no -inf select.
        mask_t = tl.full([BLOCK_T], 1, tl.int1)
    else:
        mask_t = offs_t < t_end
    if CENTROID_TABLE:
        codes = tl.load(p_centroid_codes + offs_t, mask=mask_t, other=0,
                        eviction_policy="evict_first").to(tl.int64)
        # [BLOCK_T, BLOCK_Q]: row codes[t] of S = centroids @ Q^T. A tl.load, not inline PTX
        # in the accumulator's layout: one 2- or 4-byte load per element there is slower than
        # the layout conversion through shared memory.
        p_rows_s = p_centroid_scores + codes[:, None] * stride_sc + offs_col[None, :]
        mask_s = mask_t[:, None] & mask_col[None, :]
        acc = tl.load(p_rows_s, mask=mask_s, other=0.0,
                      eviction_policy="evict_last").to(tl.float32)
        if HOLD_QUERY:
            acc = tl.trans(acc)
    elif HOLD_QUERY:
        acc = tl.zeros([BLOCK_Q, BLOCK_T], tl.float32)
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_Q], tl.float32)
    # The first two chunks' query tiles are held by the caller (b_q0, b_q1), unrolled; the
    # rest stream in a dynamic loop, which reuses one set of shared-memory staging buffers
    # (unrolled, each chunk's add up: 393 KB at fp32, d = 768, M = 16).
    HELD_M_BLOCKS: tl.constexpr = 2 if NUM_M_BLOCKS > 2 else NUM_M_BLOCKS
    for kd in tl.static_range(HELD_M_BLOCKS):
        acc = _pq_chunk_product(
            kd, acc, b_q0 if kd == 0 else b_q1, next_words, offs_t, mask_t, p_pq_codes,
            p_codebooks, num_subquantizers, stride_pt, BLOCK_T, M_BLOCK, DSUB, DSUB_PAD,
            INPUT_PRECISION, UPCAST, FULL, WORD_GATHER, PTX_LOADS, GATHER_BYTES, HOLD_QUERY,
            PIPELINE_CODES)
    if NUM_M_BLOCKS > HELD_M_BLOCKS:  # (its body builds only for chunks of that shape)
        for kd in range(HELD_M_BLOCKS, NUM_M_BLOCKS):
            b_q = _load_query_pq_tile(p_q, offs_b, offs_i, mask_r, kd, stride_qb, stride_qt,
                                      stride_qd, num_subquantizers, M_BLOCK, DSUB, DSUB_PAD)
            b_q = _to_gather16_order(b_q, BLOCK_Q, M_BLOCK * DSUB_PAD, GATHER_BYTES, HOLD_QUERY)
            acc = _pq_chunk_product(
                kd, acc, b_q, next_words, offs_t, mask_t, p_pq_codes, p_codebooks,
                num_subquantizers, stride_pt, BLOCK_T, M_BLOCK, DSUB, DSUB_PAD, INPUT_PRECISION,
                UPCAST, FULL, WORD_GATHER, PTX_LOADS, GATHER_BYTES, HOLD_QUERY, False)
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
    WORD_GATHER: tl.constexpr, PTX_LOADS: tl.constexpr,
    GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr, PIPELINE_CODES: tl.constexpr,
    REDUCE_PER_TILE: tl.constexpr,
):
    """Scores the out_idx-th scored document against the program's query block and stores them
    (nothing for a slot past the last document)."""
    valid_doc, start, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS)
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
    if M_BLOCK >= CODES_PER_WORD:
        next_words = tl.zeros([BLOCK_T, M_BLOCK // CODES_PER_WORD], tl.int32)
    else:
        # A chunk of fewer sub-quantizers than a code word holds (M < 4, or d/M > 32) has no
        # word gathers, so no code words to pipeline: a placeholder of a legal shape, never read.
        next_words = tl.zeros([BLOCK_T, 1], tl.int32)
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
            GATHER_BYTES, HOLD_QUERY, PIPELINE_CODES)
        if REDUCE_PER_TILE:
            row_max = maximum_nan(row_max, max_nan(scores, 1))
        else:
            tile_max = maximum_nan(tile_max, scores)
    if not REDUCE_PER_TILE:
        row_max = max_nan(tile_max, 1)
    for t0 in range(full_end, end, BLOCK_T_TAIL):
        scores = _pq_tile_scores(
            t0, end, next_words, b_q0, b_q1, offs_b, offs_i, mask_r, offs_col, mask_col,
            p_q, p_pq_codes, p_codebooks, p_centroid_codes, p_inv_norms, p_centroid_scores,
            num_subquantizers, stride_qb, stride_qt, stride_qd, stride_pt, stride_sc,
            BLOCK_T_TAIL, BLOCK_Q, M_BLOCK, NUM_M_BLOCKS, DSUB, DSUB_PAD, CENTROID_TABLE,
            PRECOMPUTED_NORMS, INPUT_PRECISION, UPCAST, False, WORD_GATHER, PTX_LOADS,
            GATHER_BYTES, HOLD_QUERY, PIPELINE_CODES and BLOCK_T_TAIL == BLOCK_T)
        row_max = maximum_nan(row_max, max_nan(scores, 1))
    _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                        valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)


@triton.jit
def _maxsim_pq_kernel(
    p_q, p_pq_codes, p_offsets, p_pids, p_codebooks, p_centroid_codes, p_inv_norms,
    p_centroid_scores, p_query_lengths, p_out, p_counter,
    num_out_docs, num_queries, Lq, num_subquantizers, num_qblocks, num_chunks,
    stride_qb, stride_qt, stride_qd, stride_pt, stride_sc, stride_ob, stride_on,
    LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_T_TAIL: tl.constexpr,
    M_BLOCK: tl.constexpr, NUM_M_BLOCKS: tl.constexpr, DSUB: tl.constexpr,
    DSUB_PAD: tl.constexpr, DOCS_PER_PROGRAM: tl.constexpr,
    HAS_PIDS: tl.constexpr, HAS_QUERY_LENGTHS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    WORD_GATHER: tl.constexpr, PTX_LOADS: tl.constexpr, PERSISTENT: tl.constexpr,
    GATHER_BYTES: tl.constexpr, HOLD_QUERY: tl.constexpr,
    PIPELINE_CODES: tl.constexpr, REDUCE_PER_TILE: tl.constexpr,
):
    """Q: [B, Lq, d = M*DSUB] (strides q*); pq_codes: [T, M] uint8 (row stride stride_pt) or,
    with WORD_GATHER, its int32 words (stride_pt in words); offsets: int64 [N+1] contiguous;
    pids: [M'] contiguous (else 0..M'-1); codebooks: [M, 256, DSUB] contiguous, Q's dtype (int32
    words with WORD_GATHER); centroid_codes: [T] contiguous and S: [C, B*Lq] fp32 (row stride
    stride_sc) when CENTROID_TABLE; inv_norms: [T] contiguous when PRECOMPUTED_NORMS;
    query_lengths: [B] contiguous; out: fp32 [B, M'] (strides o*); counter (PERSISTENT, one
    query block): int32 [1], zero at launch, the next chunk of DOCS_PER_PROGRAM documents to
    score, of num_chunks. HOLD_QUERY (one warp, 16-bit Q, BLOCK_Q and the chunk width multiples
    of 16): the first two query chunks are held as the products' first operand. PIPELINE_CODES
    (word gathers, one chunk of sub-quantizers): a full tile's code words are loaded while the
    tile before it is scored. REDUCE_PER_TILE: each full tile's scores are reduced over its
    tokens as they come. PTX_LOADS (word gathers on a GPU): words read by inline PTX."""
    pid = tl.program_id(0)
    pid_qblock = pid % num_qblocks
    pid_docs = pid // num_qblocks
    BLOCK_Q: tl.constexpr = QUERIES_PER_BLOCK * LQ

    offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
    offs_col = offs_b * Lq + offs_i
    mask_col = (offs_b < num_queries) & (offs_i < Lq)
    # [BLOCK_Q, M_BLOCK * DSUB_PAD]: the first two chunks stay in registers / shared memory
    # across every tile of the program (d = 128 is one chunk); later chunks are reloaded per
    # tile from L1/L2.
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
        p_codebooks = p_codebooks.to(tl.pointer_type(tl.int32))

    if PERSISTENT:
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
                    INPUT_PRECISION, UPCAST, WORD_GATHER, PTX_LOADS, GATHER_BYTES,
                    HOLD_QUERY, PIPELINE_CODES, REDUCE_PER_TILE)
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
                INPUT_PRECISION, UPCAST, WORD_GATHER, PTX_LOADS, GATHER_BYTES,
                HOLD_QUERY, PIPELINE_CODES, REDUCE_PER_TILE)
