"""Fused MaxSim over PLAID residual codes: documents are decoded in registers, never in memory.

    score[b, n] = sum_i max_t <Q[b, i], e_t>,   e_t = (c[code_t] + w[bucket_t]) / ||c[code_t] + w[bucket_t]||

for the tokens t of document n (packed rows ``offsets[n]:offsets[n+1]``).

Where the time goes. At nbits = 2, d = 128 a token is 4 B of code + 32 B of residual bits (+4 B of
precomputed inverse norm): a 100k-document candidate set is ~0.3 GB, a few tens of microseconds
of HBM. What costs is turning bits into tensor-core operands (128 weights per token), so the
kernel is built around the instructions per embedding element:

* Centroid part by table (CENTROID_TABLE). <q, c + r> / ||c + r|| = (<q, c> + <q, r>) * inv_norm.
  The host builds S = centroids @ Q^T once per query batch ([C, B*Lq], fp32, or fp16 for fp16
  queries; L2-resident for C = 65,536 and one 32-token query) and the kernel gathers one
  contiguous row of S per token (128 B, or 64) instead of a 256-B centroid row, and never adds
  centroid and residual element by element. The dot product runs over residual weights only.
  Needs the per-token inverse norms (codecs/residual.residual_inverse_norms, computed once at
  index load).
* Centroid rows by gather (otherwise): the centroid row is gathered (the table sits in L2),
  added to the decoded residual in fp32 and rounded once to Q's dtype (the value colbert-ai's
  GPU path computes in fp16); the norm is accumulated from the same tile when no precomputed
  inverse norms are given. Used when S would not fit in L2 (many queries) or without norms.
* Bits to weights. Residual rows are read whole with vector loads, as 32-bit little-endian
  words when the host finds them 4-byte aligned (a quarter of the load instructions of bytes),
  else as bytes (UNIT_BYTES). Each unit is broadcast over its fields in registers
  ([BLOCK_T, UNITS, PER_UNIT] with a compile-time shift per field, flattened in dimension
  order), so a field is one shift and one mask; the bit reversal of colbert-ai's fields is folded
  into the weight tables (ops/residual.decode_table, built on the host; the byte permutes build
  their registers from the bucket weights in the kernel, _permute_registers). Decoders
  (DECODE_GROUP dimensions per lookup):
    - pairs (2): the 2 * nbits bits of dimensions (2p, 2p+1) index a table of 2**(2 * nbits)
      weight pairs, each entry both weights packed in one integer (64 B at nbits = 2 with fp16:
      one L1 line for the whole warp). Shift, mask, one L1 load, and the split is a bitcast: two
      tensor-core operands per lookup.
    - permute (0: no lookups; nbits = 2 or 4, word units, 16-bit weights): the weights' low
      bytes and high bytes sit in registers (two at nbits = 2, eight at nbits = 4). At nbits =
      2 one PTX byte permute assembles the two weights of a k-pair from a selector computed
      from the word (shift, mask, one multiply-add); at nbits = 4 four fields take four
      permutes of the low and high bytes, two byte selects and two interleaving permutes
      (_permute_nibbles): no L1 access at all. The weights come out in the fp16 operand's
      register order (_operand_dims), so the held query chunk is permuted once per program.
    - select (1): one field per dimension, the weight picked by a select tree on the field's bits
      (nbits <= 2) or loaded from the 2**nbits table (nbits = 4). No loads, more ALU; the host
      takes it for byte units in chunks narrower than 128 columns, where pairs are wrong on the
      GPU (see results/compressed/h200-diag).
* Loads by inline PTX (PTX_LOADS, on a GPU). A tl.load gets a coalesced layout of its own; the
  residual words and the pair-table entries would then reach the tensor-core operand's layout
  through shared memory on every tile. tl.inline_asm_elementwise loads are elementwise, so they
  take the operand's layout and each value lands in the thread that decodes it. The interpreter
  cannot run PTX and takes tl.load.
* Grid: one program per DOCS_PER_PROGRAM documents, or (PERSISTENT) a fixed grid whose programs
  take chunks of documents from an atomic counter, so none is left running a last wave alone.
* PREFETCH: an L2 prefetch of each document's rows past its first tile before its tiles are
  walked (GPU only). It pays beside the fp16 table; beside the fp32 one the extra L2 traffic
  costs more than the latency it hides.
* PIPELINE_CODES: each main tile's codes are loaded while the tile before it is scored, so the
  tile's rows of S are gathered at once rather than behind a dependent load of its codes.
* Tiles: documents are walked in tiles of BLOCK_T tokens, then the remainder in tiles of
  BLOCK_T_TAIL, so a 70-token document decodes 80 rows rather than 128. Main tiles are full by
  construction: their loads are unmasked and their scores go into an elementwise running max,
  reduced over tokens (cross-lane shuffles) once per document. d is walked in chunks of BLOCK_D
  (d = 384 is 3 x 128 in a dynamic loop, d = 96 one masked 128 chunk), never padded in memory;
  with one chunk the query tile stays in registers / shared memory for the whole program.

* fp32 queries. With tf32x3 products (the default for fp32) the decoded tile is fp32 and each
  product is three tf32 MMAs: about 3x the fp16 time. SPLIT_Q (table path only) keeps the fp16
  decode and multiplies it by the query's fp16 head and fp16 tail (q = head + tail to ~2**-22):
  two fp16 MMAs, so about the fp16 time. The centroid part still comes from the fp32 table; the
  one rounding left is each residual weight's to fp16 (2**-11 of a weight of ~0.03-0.1 in a
  part of the score that is itself small), about 1e-5 per document score.

Masking: a token past its document's end is -inf (never wins a max); a query row past its
query's length contributes 0. Residual units past d read as a pad unit whose every field decodes
to the first finite weight (not field 0's, which may be NaN or inf), so the zero query columns
cancel them. An empty document scores -inf, an empty query 0. Token indices are
int64; offsets into the centroid table and S are int32 (the host checks they fit).
"""

import triton
import triton.language as tl

from tilemaxsim_plaid.kernels.common import (max_nan, maximum_nan, packed_doc_bounds,
                                             prefetch_rows_l2, tile_dot, unpack_16bit_weights)
from tilemaxsim_plaid.kernels.maxsim_centroid import probe_tile
from tilemaxsim_plaid.kernels.maxsim_dense import _query_rows, _store_query_scores


@triton.jit
def _query_centroid_scores_kernel(
    p_centroids, p_q, p_out, p_head, p_tail, p_keep, p_block_max, p_block_arg,
    num_centroids, num_rows, dim, threshold,
    stride_cc, stride_cd, stride_qr, stride_qd, stride_oc, stride_qb, query_rows,
    BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, SPLIT_Q: tl.constexpr,
    PROBE: tl.constexpr, PERMUTE_32: tl.constexpr,
):
    """S[c, r] = <centroids[c], Q_rows[r]> in fp32.

    centroids: [C, d] (any float dtype; with UPCAST both sides are multiplied in fp32);
    Q_rows: [R, d] (all query tokens, flattened); S: [C, R].

    SPLIT_Q (fp16 centroids, fp32 query): each query chunk is split into its fp16 head and the
    fp16 rounding of what the head misses (q = head + tail to ~2**-22), and both are multiplied
    on fp16 tensor cores. fp16 x fp16 products are exact in the fp32 accumulator, so S carries an
    fp32 product's accuracy while the centroids are read in fp16. The programs of the first
    centroid block also store head and tail ([R, d] fp16 each, contiguous): the residual
    kernel's SPLIT_Q operands, without launches of their own.

    PROBE (one block of rows: num_rows <= BLOCK_R): each program also reduces its block of S for
    stage 1 (maxsim_centroid.probe_tile: the pruning mask and the per-block argmax of each
    row), so candidate generation reads no table.

    PERMUTE_32 (the mma kernel's table, ops/residual_mma.permuted_table): Q is [B, query_rows
    <= 32, d] (stride_qb, stride_qr) and S has 32 columns per query, column 4 (R % 8) + R // 8
    holding row R, zero past query_rows: num_rows = 32 B.
    """
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    offs_c = pid_c.to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_c = offs_c < num_centroids
    mask_r = offs_r < num_rows
    acc = tl.zeros([BLOCK_C, BLOCK_R], tl.float32)
    for d0 in range(0, dim, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < dim
        # [BLOCK_R, BLOCK_D]
        if PERMUTE_32:
            column = offs_r % 32
            row = 8 * (column % 4) + column // 4
            row_offsets = (offs_r // 32).to(tl.int64) * stride_qb + row * stride_qr
            mask_q = (mask_r & (row < query_rows))[:, None] & mask_d[None, :]
        else:
            row_offsets = offs_r * stride_qr
            mask_q = mask_r[:, None] & mask_d[None, :]
        b_q = tl.load(p_q + row_offsets[:, None] + offs_d[None, :] * stride_qd,
                      mask=mask_q, other=0.0)
        # [BLOCK_C, BLOCK_D]
        b_c = tl.load(p_centroids + offs_c[:, None] * stride_cc + offs_d[None, :] * stride_cd,
                      mask=mask_c[:, None] & mask_d[None, :], other=0.0)
        # [BLOCK_C, BLOCK_D] @ [BLOCK_D, BLOCK_R] -> [BLOCK_C, BLOCK_R]
        if SPLIT_Q:
            b_head = b_q.to(tl.float16)
            b_tail = (b_q - b_head.to(tl.float32)).to(tl.float16)
            if pid_c == 0:
                split_offsets = offs_r[:, None] * dim + offs_d[None, :]
                tl.store(p_head + split_offsets, b_head, mask=mask_q)
                tl.store(p_tail + split_offsets, b_tail, mask=mask_q)
            acc += tile_dot(b_c, b_head, INPUT_PRECISION, UPCAST)
            acc += tile_dot(b_c, b_tail, INPUT_PRECISION, UPCAST)
        else:
            if not UPCAST:
                b_c = b_c.to(b_q.dtype)
            acc += tile_dot(b_c, b_q, INPUT_PRECISION, UPCAST)
    tl.store(p_out + offs_c[:, None] * stride_oc + offs_r[None, :], acc,
             mask=mask_c[:, None] & mask_r[None, :])
    if PROBE:
        probe_tile(acc, offs_c, offs_r, mask_c, mask_c[:, None] & mask_r[None, :], num_centroids,
                   threshold, p_keep, p_block_max, p_block_arg, pid_c, tl.num_programs(0))


@triton.jit
def _unit_shifts(NBITS: tl.constexpr, UNIT_BYTES: tl.constexpr, WIDTH: tl.constexpr):
    """[UNIT_BYTES * 8 // (NBITS * WIDTH)] bit shift of each column group within a unit.

    A group is WIDTH adjacent dimensions (1, or 2 for a pair, whose first dimension is the higher
    field). Dimension k of a unit sits in byte k // SLOTS at bit 8 - NBITS * (k % SLOTS + 1)
    (colbert-ai's packbits order); the unit (word or byte) is little-endian.
    """
    SLOTS: tl.constexpr = 8 // NBITS
    offs_k = WIDTH * tl.arange(0, UNIT_BYTES * 8 // (NBITS * WIDTH))  # first dimension
    return 8 * (offs_k // SLOTS) + 8 - NBITS * (offs_k % SLOTS + WIDTH)


@triton.jit
def _ptx_load_words(ptrs, mask, pad, MASKED: tl.constexpr, PADDED: tl.constexpr):
    """int32 words at ``ptrs`` (where masked: ``pad`` with PADDED, else 0), streamed (L1
    evict-first), by inline PTX.

    An inline-asm load is an elementwise op, so it takes whatever layout its consumer needs,
    here the tensor-core operand's: the words land in the threads that decode them. A tl.load is
    given a coalesced layout of its own, and its result crosses shared memory (store, barrier,
    load) to reach the operand's layout on every tile.
    """
    if MASKED and PADDED:
        flags = mask.to(tl.int32)
        words = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; mov.b32 $0, $3; "
            "@p ld.global.L1::evict_first.b32 $0, [$1]; }",
            "=r,l,r,r", [ptrs, flags, pad + tl.zeros_like(flags)], dtype=tl.int32, is_pure=True,
            pack=1)
    elif MASKED:
        words = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; mov.b32 $0, 0; "
            "@p ld.global.L1::evict_first.b32 $0, [$1]; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=True, pack=1)
    else:
        words = tl.inline_asm_elementwise("ld.global.L1::evict_first.b32 $0, [$1];", "=r,l",
                                          [ptrs], dtype=tl.int32, is_pure=True, pack=1)
    return words


@triton.jit
def _ptx_load_table(ptrs, ENTRY_HALF_BITS: tl.constexpr):
    """Pair-table entries at ``ptrs`` (32-bit for ENTRY_HALF_BITS = 16, else 64-bit) through
    the read-only path (L1 evict-last), by inline PTX: like _ptx_load_words, the entries arrive
    in the operand's layout, with no shared-memory round trip per tile."""
    if ENTRY_HALF_BITS == 16:
        entry = tl.inline_asm_elementwise("ld.global.nc.L1::evict_last.b32 $0, [$1];", "=r,l",
                                          [ptrs], dtype=tl.int32, is_pure=True, pack=1)
    else:
        entry = tl.inline_asm_elementwise("ld.global.nc.L1::evict_last.b64 $0, [$1];", "=l,l",
                                          [ptrs], dtype=tl.int64, is_pure=True, pack=1)
    return entry


@triton.jit
def _byte_permute(lo_bytes, hi_bytes, selector, USE_PTX: tl.constexpr):
    """PTX ``prmt.b32``: byte k of the result is byte (bits 0-2 of nibble k of ``selector``) of
    the 8 bytes ``hi_bytes:lo_bytes``, or with the nibble's bit 3 set, that byte's top bit
    copied into all eight (0x00 or 0xFF); bits 16-31 of the selector are ignored. Without PTX
    (the CPU interpreter) the same selection in int64 arithmetic."""
    if USE_PTX:
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [lo_bytes + tl.zeros_like(selector),
                                          hi_bytes + tl.zeros_like(selector), selector],
                                         dtype=tl.int32, is_pure=True, pack=1)
    source = (lo_bytes.to(tl.int64) & 0xFFFFFFFF) | (hi_bytes.to(tl.int64) << 32)
    out = tl.zeros_like(selector).to(tl.int64)
    for k in tl.static_range(4):
        nibble = ((selector >> (4 * k)) & 0xF).to(tl.int64)
        byte = (source >> (8 * (nibble & 7))) & 0xFF
        byte = tl.where(nibble >= 8, tl.where(byte >= 0x80, 0xFF, 0), byte)
        out |= byte << (8 * k)
    return out.to(tl.int32)


@triton.jit
def _operand_dims(offs_c, DECODE_GROUP: tl.constexpr, NBITS: tl.constexpr):
    """The embedding dimension behind each tensor-core operand column. The byte-permute decoder
    (DECODE_GROUP 0) emits its weights in the order of the fp16 operand's registers: in each
    16-column block, column 8h + 2j + p holds dimension j + 4p + 8h at nbits = 2 (j < 4: the
    lane of a quad, p and h: its register halves; the quad shares one word) and dimension
    4j + 2h + p at nbits = 4 (lane j decodes the j-th half-word of the block's two words), so
    the query and centroid columns are read in that order too, which leaves every dot product
    unchanged. Other decoders: the identity."""
    if DECODE_GROUP == 0:
        column = offs_c % 16
        j = (column % 8) // 2
        h = column // 8
        p = column % 2
        if NBITS == 4:
            return offs_c - column + 4 * j + 2 * h + p
        return offs_c - column + j + 4 * p + 8 * h
    return offs_c


@triton.jit
def _columns_to_operand_order(b_q, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                              DECODE_GROUP: tl.constexpr, NBITS: tl.constexpr):
    """[ROWS, BLOCK_D] columns in dimension order -> in _operand_dims order, by a register
    permutation (a one-off layout conversion), so the held query chunk is still read with
    contiguous vector loads."""
    if DECODE_GROUP == 0:
        if NBITS == 4:
            # dimension 16w + 4j + 2h + p -> column 16w + 8h + 2j + p
            b_q = tl.reshape(b_q, [ROWS, BLOCK_D // 16, 4, 2, 2])
            b_q = tl.reshape(tl.permute(b_q, (0, 1, 3, 2, 4)), [ROWS, BLOCK_D])
        else:
            # dimension 16w + 8h + 4p + j -> column 16w + 8h + 2j + p
            b_q = tl.reshape(b_q, [ROWS, BLOCK_D // 16, 2, 2, 4])
            b_q = tl.reshape(tl.permute(b_q, (0, 1, 2, 4, 3)), [ROWS, BLOCK_D])
    return b_q


@triton.jit
def _round_to_16bit(x, dot_dtype: tl.constexpr):
    """The bits (int32, low 16) of fp32 ``x`` rounded to dot_dtype (fp16 or bf16) to nearest,
    ties to even, as torch casts. bf16 by integer arithmetic: the interpreter truncates a cast
    to bf16, the GPU rounds it; a NaN stays a (quiet) NaN."""
    if dot_dtype == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return tl.where(x != x, (bits >> 16) | 0x40, rounded) & 0xFFFF
    return x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _permute_registers(p_weights, dot_dtype: tl.constexpr, NBITS: tl.constexpr):
    """(w0, w1, w2, w3): the bucket weights (``p_weights``, [2**NBITS], any float dtype) cast to
    dot_dtype, in field order (colbert-ai's bits are reversed within a field: field f holds
    bucket reverse(f)), as the byte permutes read them. NBITS = 2: w0 / w1 the low / high bytes
    of the four weights, byte f each (int32; w2 = w3 = 0). NBITS = 4: w0 / w1 the low bytes of
    fields 0-7 / 8-15, byte f % 8 each, w2 / w3 their high bytes (int64). Built once per
    program, so no table is made on the host."""
    FIELDS: tl.constexpr = 1 << NBITS
    f = tl.arange(0, FIELDS)
    bucket = tl.zeros_like(f)
    for b in tl.static_range(NBITS):
        bucket |= ((f >> b) & 1) << (NBITS - 1 - b)
    bits = _round_to_16bit(tl.load(p_weights + bucket).to(tl.float32), dot_dtype)
    # Disjoint bytes: each sum is their OR.
    shift = (8 * (f % 8)).to(tl.int64)
    low = (bits & 0xFF).to(tl.int64) << shift
    high = ((bits >> 8) & 0xFF).to(tl.int64) << shift
    if NBITS == 4:
        w0 = tl.sum(tl.where(f < 8, low, 0), axis=0)
        w1 = tl.sum(tl.where(f < 8, 0, low), axis=0)
        w2 = tl.sum(tl.where(f < 8, high, 0), axis=0)
        w3 = tl.sum(tl.where(f < 8, 0, high), axis=0)
    else:
        w0 = tl.sum(low, axis=0).to(tl.uint32).to(tl.int32, bitcast=True)
        w1 = tl.sum(high, axis=0).to(tl.uint32).to(tl.int32, bitcast=True)
        w2 = 0
        w3 = 0
    return w0, w1, w2, w3


@triton.jit
def _select_bytes(a, b, mask):
    """Byte k of ``b`` where byte k of ``mask`` is 0xFF, else of ``a`` (one LOP3)."""
    return (a & ~mask) | (b & mask)


@triton.jit
def _permute_nibbles(b_units, w0, w1, w2, w3, dot_dtype: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_D: tl.constexpr, USE_PTX: tl.constexpr):
    """[BLOCK_T, BLOCK_D // 8] int32 words of nbits = 4 fields -> [BLOCK_T, BLOCK_D] 16-bit
    weights in _operand_dims order, by byte permutes from registers (no table loads).

    w0 / w1: the low bytes of the weights of fields 0-7 / 8-15 (int64, field f in byte f % 8),
    w2 / w3: their high bytes. Lane j of a quad takes half-word j % 2 of the block's word j // 2:
    four fields, nibbles k = 0-3 (byte 0's high nibble is the first dimension). A permute of
    the low bytes of fields 0-7 with the selector (fields & 7) gives the four low bytes where
    the field is below 8, one of fields 8-15 where it is 8 or more; the fields' top bits, each
    spread over its byte by a sign-replicating permute, pick between the two (one LOP3); the
    same for the high bytes; two permutes then interleave them into the weights of dimensions
    (4j, 4j + 1) and (4j + 2, 4j + 3), columns 2j + p and 8 + 2j + p of the 16-column block."""
    KB: tl.constexpr = BLOCK_D // 16
    # [BLOCK_T, KB, 2 (word of the block), 2 (half-word)]: the quad's lanes.
    words = tl.reshape(b_units, [BLOCK_T, KB, 2])
    fields = words[:, :, :, None] >> (16 * tl.arange(0, 2))[None, None, None, :]
    selector = fields & 0x7777
    # Byte k = 0xFF where nibble k is 8-15: bit 3 of nibble k is the top bit of byte k // 2
    # of (fields << 4) (k even) or of fields (k odd).
    high = _byte_permute(fields << 4, fields, 0xD9C8 + tl.zeros_like(fields), USE_PTX)
    lo = _select_bytes(_byte_permute(w0.to(tl.int32), (w0 >> 32).to(tl.int32), selector, USE_PTX),
                       _byte_permute(w1.to(tl.int32), (w1 >> 32).to(tl.int32), selector, USE_PTX),
                       high)
    hi = _select_bytes(_byte_permute(w2.to(tl.int32), (w2 >> 32).to(tl.int32), selector, USE_PTX),
                       _byte_permute(w3.to(tl.int32), (w3 >> 32).to(tl.int32), selector, USE_PTX),
                       high)
    # [BLOCK_T, KB, 2 (+8 columns), 2 (word), 2 (half-word)]: bytes (1, 5, 0, 4) are the weight
    # of nibble 1 (dimension 4j) then of nibble 0 (4j + 1); (3, 7, 2, 6) those of 4j + 2, 4j + 3.
    # Broadcast into the operand's register order, not joined and permuted after: Triton
    # converts that through shared memory on every tile.
    zero = tl.zeros([BLOCK_T, KB, 2, 2, 2], tl.int32)
    order = tl.where(tl.arange(0, 2) == 0, 0x4051, 0x6273)[None, None, :, None, None] + zero
    packed = _byte_permute(lo[:, :, None, :, :] + zero, hi[:, :, None, :, :] + zero, order,
                           USE_PTX)
    return tl.reshape(unpack_16bit_weights(packed, dot_dtype, 2), [BLOCK_T, BLOCK_D])


@triton.jit
def _decode_chunk(b_units, p_table, w0, w1, w2, w3, dot_dtype: tl.constexpr,
                  NBITS: tl.constexpr, UNIT_BYTES: tl.constexpr, DECODE_GROUP: tl.constexpr,
                  ELEM_BITS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                  PTX_LOADS: tl.constexpr):
    """[BLOCK_T, UNITS] int32 residual units -> [BLOCK_T, BLOCK_D] weights in dot_dtype.

    Each unit is broadcast over its column groups in registers ([BLOCK_T, UNITS, PER_UNIT],
    flattened in dimension order), so rows are read with vector loads, once.
    """
    if DECODE_GROUP == 0 and NBITS == 4:
        return _permute_nibbles(b_units, w0, w1, w2, w3, dot_dtype, BLOCK_T, BLOCK_D, PTX_LOADS)
    elif DECODE_GROUP == 0:
        # Byte permutes (nbits = 2, word units, 16-bit weights); w0 / w1 hold the low / high
        # bytes of the four weights in field order. Byte b of a word holds dimensions 4b .. 4b+3,
        # dimension 4b + j at bit 8b + 6 - 2j, so shifting by 6 - 2j and masking 0x03030303
        # leaves the fields of dimensions j, 4 + j, 8 + j, 12 + j in bytes 0-3. Times 0x11 plus
        # 0x40404040 each byte becomes the selector nibbles (f, 4 + f) of its weight, and one
        # permute of the low 16 bits (then of the high 16) assembles the weights of dimensions
        # (j, 4 + j) (then (8 + j, 12 + j)): the columns _operand_dims names. No memory access.
        offs_j = tl.arange(0, 4)
        fields = (b_units[:, :, None] >> (6 - 2 * offs_j)[None, None, :]) & 0x03030303
        selector = fields * 0x11 + 0x40404040
        # [BLOCK_T, UNITS, 2 (h), 4 (j)]
        selector = selector[:, :, None, :] >> (16 * tl.arange(0, 2))[None, None, :, None]
        packed = _byte_permute(w0, w1, selector, PTX_LOADS)
        weights = unpack_16bit_weights(packed, dot_dtype, 2)
        return tl.reshape(weights, [BLOCK_T, BLOCK_D])
    elif DECODE_GROUP == 2:
        # Two dimensions per lookup: their 2 * NBITS bits index the pair table, whose entries
        # pack both weights into one integer (first dimension in the low bits).
        shift = _unit_shifts(NBITS, UNIT_BYTES, 2)
        idx = (b_units[:, :, None] >> shift[None, None, :]) & ((1 << (2 * NBITS)) - 1)
        # [BLOCK_T, BLOCK_D // 2]: 64 B of table at nbits = 2; L1-resident.
        idx = tl.reshape(idx, [BLOCK_T, BLOCK_D // 2])
        if PTX_LOADS:
            entry = _ptx_load_table(p_table + idx, ELEM_BITS)
        else:
            entry = tl.load(p_table + idx, eviction_policy="evict_last")
        if ELEM_BITS == 16:
            # Two weights in an int32.
            groups = unpack_16bit_weights(entry, dot_dtype, 2)
        else:
            lo = entry.to(tl.int32)
            hi = (entry >> 32).to(tl.int32)
            groups = tl.join(lo.to(dot_dtype, bitcast=True), hi.to(dot_dtype, bitcast=True))
        return tl.reshape(groups, [BLOCK_T, BLOCK_D])
    else:
        shift = _unit_shifts(NBITS, UNIT_BYTES, 1)
        field = (b_units[:, :, None] >> shift[None, None, :]) & ((1 << NBITS) - 1)
        if NBITS == 1:
            weights = tl.where(field != 0, w1, w0)
        elif NBITS == 2:
            bit0 = (field & 1) != 0
            weights = tl.where(field >= 2, tl.where(bit0, w3, w2), tl.where(bit0, w1, w0))
        else:
            # A 15-select tree would cost more than one L1 load from the 16-entry table.
            weights = tl.load(p_table + field, eviction_policy="evict_last")
        return tl.reshape(weights, [BLOCK_T, BLOCK_D])


@triton.jit
def decode_pair_words_fp16(words, p_table, NBITS: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_D: tl.constexpr, PTX_LOADS: tl.constexpr):
    """[BLOCK_T, BLOCK_D * NBITS // 32] int32 residual words (colbert-ai's bit layout, rows
    little-endian) -> [BLOCK_T, BLOCK_D] fp16 weights, by the pair decoder the kernel uses;
    ``p_table`` points at ``ops.residual.decode_table(bucket_weights, NBITS, torch.float16, 2)``.

    Public for measurements that time the decode alone (experiments/residual_floors.py)."""
    return _decode_chunk(words, p_table, 0.0, 0.0, 0.0, 0.0, tl.float16, NBITS, 4, 2, 16,
                         BLOCK_T, BLOCK_D, PTX_LOADS)


@triton.jit
def _finite(x):
    """Whether each value is neither inf nor NaN."""
    return tl.abs(x.to(tl.float32)) < float("inf")


@triton.jit
def _first_true(flags, N: tl.constexpr):
    """The smallest index of [N] ``flags`` that is true; 0 when none is."""
    first = tl.min(tl.where(flags, tl.arange(0, N), N), axis=0)
    return tl.where(first == N, 0, first)


@triton.jit
def _first_finite_field(p_table, w0, w1, w2, w3, dot_dtype: tl.constexpr, NBITS: tl.constexpr,
                        DECODE_GROUP: tl.constexpr, ELEM_BITS: tl.constexpr):
    """The smallest raw field value whose decoded weight is finite (0 when none is), read from
    the decoder's own table or registers (see _decode_chunk, _permute_registers and the kernel's
    table argument)."""
    FIELDS: tl.constexpr = 1 << NBITS
    if DECODE_GROUP == 0 and NBITS == 4:
        # Weight f is byte f % 8 of w0 / w1 (its low byte) and of w2 / w3 (its high byte).
        f = tl.arange(0, FIELDS)
        shift = 8 * (f % 8)
        low = (tl.where(f < 8, w0, w1) >> shift) & 0xFF
        high = (tl.where(f < 8, w2, w3) >> shift) & 0xFF
        bits = low | (high << 8)
        field = _first_true(_finite(bits.to(tl.int16).to(dot_dtype, bitcast=True)), FIELDS)
    elif DECODE_GROUP == 0:
        # Weight f is byte f of w0 (its low byte) and byte f of w1 (its high byte).
        shift = 8 * tl.arange(0, 4)
        bits = ((w0 >> shift) & 0xFF) | (((w1 >> shift) & 0xFF) << 8)
        field = _first_true(_finite(bits.to(tl.int16).to(dot_dtype, bitcast=True)), 4)
    elif DECODE_GROUP == 2:
        # Entry g * (FIELDS + 1) is the pair of fields (g, g): its low half is weight g.
        entry = tl.load(p_table + (FIELDS + 1) * tl.arange(0, FIELDS))
        if ELEM_BITS == 16:
            low = entry.to(tl.int16)
        else:
            low = entry.to(tl.int32)
        field = _first_true(_finite(low.to(dot_dtype, bitcast=True)), FIELDS)
    elif NBITS == 4:
        # The field table.
        field = _first_true(_finite(tl.load(p_table + tl.arange(0, FIELDS))), FIELDS)
    elif NBITS == 2:
        field = tl.where(_finite(w0), 0, tl.where(_finite(w1), 1, tl.where(
            _finite(w2), 2, tl.where(_finite(w3), 3, 0))))
    else:
        field = tl.where(_finite(w0), 0, tl.where(_finite(w1), 1, 0))
    return field


@triton.jit
def _pad_unit(field, NBITS: tl.constexpr, UNIT_BYTES: tl.constexpr):
    """A UNIT_BYTES-byte residual unit whose every NBITS-bit field is ``field`` (int32)."""
    if UNIT_BYTES == 1:
        unit = field * (0xFF // ((1 << NBITS) - 1))
    elif NBITS == 1:
        unit = -field  # 0 or all ones
    elif NBITS == 2:
        unit = field * 0x55555555
    else:
        unit = field * 0x11111111
    return unit


@triton.jit
def _chunk_product(kd, b_q, b_q_lo, acc, sum_sq, offs_t, mask_t, p_rows, codes, p_table,
                   w0, w1, w2, w3, pad_unit, p_centroids, dim, units_per_row, stride_cc, stride_cd,
                   NBITS: tl.constexpr, UNIT_BYTES: tl.constexpr, DECODE_GROUP: tl.constexpr,
                   ELEM_BITS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                   CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
                   SPLIT_Q: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                   FULL: tl.constexpr, EVEN_D: tl.constexpr, PTX_LOADS: tl.constexpr):
    """acc += decoded chunk kd of the tile @ b_q^T (and sum_sq += its squared norms).
    SPLIT_Q: b_q and b_q_lo are the fp16 head and tail of an fp32 query; both are multiplied."""
    UNITS: tl.constexpr = BLOCK_D * NBITS // (8 * UNIT_BYTES)
    offs_u = kd * UNITS + tl.arange(0, UNITS)
    # [BLOCK_T, UNITS]: whole rows, streamed once.
    p_units = p_rows[:, None] + offs_u[None, :]
    mask_units = mask_t[:, None] & (offs_u < units_per_row)[None, :]
    # Masked units past d read as pad_unit (a constant 0 when EVEN_D): every field decodes to a
    # finite weight, which the zero query columns cancel.
    if PTX_LOADS and UNIT_BYTES == 4:
        b_units = _ptx_load_words(p_units, mask_units, pad_unit, not (FULL and EVEN_D),
                                  not EVEN_D)
    else:
        b_units = tl.load(p_units, mask=mask_units, other=pad_unit,
                          eviction_policy="evict_first").to(tl.int32)
    b_emb = _decode_chunk(b_units, p_table, w0, w1, w2, w3, b_q.dtype, NBITS, UNIT_BYTES,
                          DECODE_GROUP, ELEM_BITS, BLOCK_T, BLOCK_D, PTX_LOADS)
    if not CENTROID_TABLE:
        offs_d = _operand_dims(kd * BLOCK_D + tl.arange(0, BLOCK_D), DECODE_GROUP, NBITS)
        mask_d = offs_d < dim
        # [BLOCK_T, BLOCK_D], centroid rows from L2
        b_c = tl.load(p_centroids + (codes * stride_cc)[:, None] + offs_d[None, :] * stride_cd,
                      mask=mask_t[:, None] & mask_d[None, :], other=0.0,
                      eviction_policy="evict_last")
        b_sum = b_c.to(tl.float32) + b_emb.to(tl.float32)
        if not PRECOMPUTED_NORMS:
            b_sum = tl.where(mask_d[None, :], b_sum, 0.0)
            sum_sq += tl.sum(b_sum * b_sum, axis=1)
        b_emb = b_sum.to(b_q.dtype)
    # [BLOCK_T, BLOCK_D] @ [BLOCK_D, BLOCK_Q] -> [BLOCK_T, BLOCK_Q]
    acc += tile_dot(b_emb, b_q, INPUT_PRECISION, UPCAST)
    if SPLIT_Q:
        acc += tile_dot(b_emb, b_q_lo, INPUT_PRECISION, UPCAST)
    return acc, sum_sq


@triton.jit
def _load_codes(p_codes, offs_t, mask_t, max_code):
    """[BLOCK_T] centroid codes of tokens offs_t as int32, clamped into [0, max_code = C - 1]: a
    code the host has not judged yet (ops/checks.py) cannot make a read outside the centroid rows
    or the table. Streamed once, so kept from evicting the L2-resident tables."""
    codes = tl.load(p_codes + offs_t, mask=mask_t, other=0, eviction_policy="evict_first")
    return tl.minimum(tl.maximum(codes.to(tl.int32), 0), max_code)


@triton.jit
def _residual_tile_scores(
    t0, t_end, next_codes, b_q0, b_q0_lo, offs_b, offs_i, mask_r, offs_col, mask_col,
    p_q, p_q_lo, p_codes, p_units, p_centroids, p_table, p_inv_norms, p_centroid_scores,
    w0, w1, w2, w3, pad_unit,
    dim, units_per_row, stride_qb, stride_qt, stride_qd, stride_ut, stride_cc, stride_cd,
    stride_sc, max_code,
    NBITS: tl.constexpr, UNIT_BYTES: tl.constexpr, DECODE_GROUP: tl.constexpr,
    ELEM_BITS: tl.constexpr, FULL: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D_BLOCKS: tl.constexpr, CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr,
    SPLIT_Q: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    EVEN_D: tl.constexpr, PTX_LOADS: tl.constexpr, PIPELINE_CODES: tl.constexpr,
):
    """[BLOCK_T, BLOCK_Q] scores of tokens t0 .. t0+BLOCK_T; those at or past t_end are -inf.
    FULL: the caller guarantees t0 + BLOCK_T <= t_end, so nothing is masked. PIPELINE_CODES: the
    tile's codes are next_codes, loaded (and clamped) by the caller a tile ahead; otherwise
    next_codes is unused."""
    offs_t = t0 + tl.arange(0, BLOCK_T)
    if FULL:
        # A constant-true mask folds away: unpredicated loads, no -inf select.
        mask_t = tl.full([BLOCK_T], 1, tl.int1)
    else:
        mask_t = offs_t < t_end
    if PIPELINE_CODES:
        codes = next_codes
    else:
        codes = _load_codes(p_codes, offs_t, mask_t, max_code)
    if CENTROID_TABLE:
        # [BLOCK_T, BLOCK_Q]: row codes[t] of S, the <q, centroid> of every query row.
        # (fp32, or fp16 for fp16 queries: half the L2 bytes per token)
        p_rows_s = p_centroid_scores + (codes * stride_sc)[:, None] + offs_col[None, :]
        mask_s = mask_t[:, None] & mask_col[None, :]
        # A tl.load, not inline PTX in the accumulator's layout: one 2- or 4-byte load per
        # element there costs more than the layout conversion through shared memory (see
        # results/compressed/h200-pq-words).
        acc = tl.load(p_rows_s, mask=mask_s, other=0.0,
                      eviction_policy="evict_last").to(tl.float32)
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_Q], tl.float32)
    p_rows = p_units + offs_t * stride_ut  # [BLOCK_T] row starts
    sum_sq = tl.zeros([BLOCK_T], tl.float32)
    if NUM_D_BLOCKS == 1:
        acc, sum_sq = _chunk_product(
            0, b_q0, b_q0_lo, acc, sum_sq, offs_t, mask_t, p_rows, codes, p_table, w0, w1, w2,
            w3, pad_unit, p_centroids, dim, units_per_row, stride_cc, stride_cd, NBITS,
            UNIT_BYTES, DECODE_GROUP, ELEM_BITS, BLOCK_T, BLOCK_D, CENTROID_TABLE,
            PRECOMPUTED_NORMS, SPLIT_Q, INPUT_PRECISION, UPCAST, FULL, EVEN_D, PTX_LOADS)
    else:
        # A dynamic loop, like a GEMM's K loop, so the next chunk's loads overlap this product.
        for kd in range(NUM_D_BLOCKS):
            offs_d = _operand_dims(kd * BLOCK_D + tl.arange(0, BLOCK_D), DECODE_GROUP, NBITS)
            # [BLOCK_Q, BLOCK_D] (L1/L2 hits); masked dimensions are 0 here, which cancels any
            # weight there.
            q_offsets = offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt + offs_d[None, :] * stride_qd
            q_mask = mask_r[:, None] & (offs_d < dim)[None, :]
            b_q = tl.load(p_q + q_offsets, mask=q_mask, other=0.0)
            if SPLIT_Q:
                b_q_lo = tl.load(p_q_lo + q_offsets, mask=q_mask, other=0.0)
            else:
                b_q_lo = b_q
            acc, sum_sq = _chunk_product(
                kd, b_q, b_q_lo, acc, sum_sq, offs_t, mask_t, p_rows, codes, p_table, w0, w1,
                w2, w3, pad_unit, p_centroids, dim, units_per_row, stride_cc, stride_cd, NBITS,
                UNIT_BYTES, DECODE_GROUP, ELEM_BITS, BLOCK_T, BLOCK_D, CENTROID_TABLE,
                PRECOMPUTED_NORMS, SPLIT_Q, INPUT_PRECISION, UPCAST, FULL, EVEN_D, PTX_LOADS)
    if PRECOMPUTED_NORMS:
        inv_norm = tl.load(p_inv_norms + offs_t, mask=mask_t, other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
    else:
        # F.normalize's eps: a zero embedding scores 0 rather than NaN (a NaN norm stays NaN).
        inv_norm = 1.0 / maximum_nan(tl.sqrt(sum_sq), 1e-12)
    scores = acc * inv_norm[:, None]
    return tl.where(mask_t[:, None], scores, float("-inf"))


@triton.jit
def _element_bytes(p):
    """Bytes per element of the pointer p's type, a constexpr. (The bit width first as a
    constexpr: triton before 3.4 cannot divide a Python int by a constexpr.)"""
    return tl.constexpr(p.dtype.element_ty.primitive_bitwidth) // 8


@triton.jit
def _prefetch_document(p_codes, p_units, p_inv_norms, first, last, stride_ut,
                       UNIT_BYTES: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr):
    """L2 prefetch of tokens first .. last: residual rows, codes and inverse norms."""
    prefetch_rows_l2(p_units, first, last, stride_ut * UNIT_BYTES, 32)
    prefetch_rows_l2(p_codes, first, last, _element_bytes(p_codes), 32)
    if PRECOMPUTED_NORMS:
        prefetch_rows_l2(p_inv_norms, first, last, _element_bytes(p_inv_norms), 32)


@triton.jit
def _score_document(
    out_idx, pid_qblock, b_q0, b_q0_lo, offs_b, offs_i, mask_r, offs_col, mask_col,
    p_q, p_q_lo, p_codes, p_units, p_offsets, p_pids, p_centroids, p_table, p_inv_norms,
    p_centroid_scores, p_out, w0, w1, w2, w3, pad_unit,
    num_out_docs, num_queries, dim, units_per_row, stride_qb, stride_qt, stride_qd, stride_ut,
    stride_cc, stride_cd, stride_sc, max_code, stride_ob, stride_on,
    NBITS: tl.constexpr, UNIT_BYTES: tl.constexpr, DECODE_GROUP: tl.constexpr,
    ELEM_BITS: tl.constexpr, LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_T_TAIL: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr, NUM_D_BLOCKS: tl.constexpr, HAS_PIDS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr, SPLIT_Q: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, EVEN_D: tl.constexpr,
    PTX_LOADS: tl.constexpr, PREFETCH: tl.constexpr, PIPELINE_CODES: tl.constexpr,
):
    """Scores the out_idx-th scored document against the program's query block and stores them
    (nothing for a slot past the last document). PREFETCH: first asks L2 for the document's
    codes, residual rows and inverse norms past its first tile, so later tiles find them there.
    PIPELINE_CODES: each main tile's codes are loaded while the tile before it is scored, so its
    centroid-score rows are gathered at once instead of behind a dependent load; rows past the
    document's end are masked. When tails are tiles of BLOCK_T too (at most one per document),
    the last load is the tail's."""
    valid_doc, start, end = packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS)
    if PREFETCH:
        _prefetch_document(p_codes, p_units, p_inv_norms, start + BLOCK_T, end, stride_ut,
                           UNIT_BYTES, PRECOMPUTED_NORMS)
    full_end = start + ((end - start) // BLOCK_T) * BLOCK_T

    if PIPELINE_CODES:
        offs_next = start + tl.arange(0, BLOCK_T)
        next_codes = _load_codes(p_codes, offs_next, offs_next < end, max_code)
    else:
        next_codes = tl.zeros([BLOCK_T], tl.int32)  # never read
    # Main tiles are full: an elementwise running max, reduced over tokens once per document.
    tile_max = tl.full([BLOCK_T, BLOCK_Q], float("-inf"), tl.float32)
    for t0 in range(start, full_end, BLOCK_T):
        codes = next_codes
        if PIPELINE_CODES:
            offs_next = t0 + BLOCK_T + tl.arange(0, BLOCK_T)
            next_codes = _load_codes(p_codes, offs_next, offs_next < end, max_code)
        scores = _residual_tile_scores(
            t0, end, codes, b_q0, b_q0_lo, offs_b, offs_i, mask_r, offs_col, mask_col,
            p_q, p_q_lo, p_codes, p_units, p_centroids, p_table, p_inv_norms,
            p_centroid_scores, w0, w1, w2, w3, pad_unit,
            dim, units_per_row, stride_qb, stride_qt, stride_qd, stride_ut, stride_cc,
            stride_cd, stride_sc, max_code,
            NBITS, UNIT_BYTES, DECODE_GROUP, ELEM_BITS, True, BLOCK_T, BLOCK_Q, BLOCK_D,
            NUM_D_BLOCKS, CENTROID_TABLE, PRECOMPUTED_NORMS, SPLIT_Q, INPUT_PRECISION, UPCAST,
            EVEN_D, PTX_LOADS, PIPELINE_CODES)
        tile_max = maximum_nan(tile_max, scores)
    row_max = max_nan(tile_max, 0)
    for t0 in range(full_end, end, BLOCK_T_TAIL):
        scores = _residual_tile_scores(
            t0, end, next_codes, b_q0, b_q0_lo, offs_b, offs_i, mask_r, offs_col, mask_col,
            p_q, p_q_lo, p_codes, p_units, p_centroids, p_table, p_inv_norms,
            p_centroid_scores, w0, w1, w2, w3, pad_unit,
            dim, units_per_row, stride_qb, stride_qt, stride_qd, stride_ut, stride_cc,
            stride_cd, stride_sc, max_code,
            NBITS, UNIT_BYTES, DECODE_GROUP, ELEM_BITS, False, BLOCK_T_TAIL, BLOCK_Q, BLOCK_D,
            NUM_D_BLOCKS, CENTROID_TABLE, PRECOMPUTED_NORMS, SPLIT_Q, INPUT_PRECISION, UPCAST,
            EVEN_D, PTX_LOADS, PIPELINE_CODES and BLOCK_T_TAIL == BLOCK_T)
        row_max = maximum_nan(row_max, max_nan(scores, 0))
    _store_query_scores(p_out, row_max, mask_r, pid_qblock, out_idx, num_queries,
                        valid_doc, stride_ob, stride_on, LQ, QUERIES_PER_BLOCK)


@triton.jit
def _maxsim_residual_kernel(
    p_q, p_q_lo, p_codes, p_units, p_offsets, p_pids, p_centroids, p_table, p_inv_norms,
    p_centroid_scores, p_query_lengths, p_out, p_counter,
    num_out_docs, num_queries, Lq, dim, units_per_row, num_qblocks, num_chunks,
    stride_qb, stride_qt, stride_qd, stride_ut, stride_cc, stride_cd, stride_sc,
    max_code, stride_ob, stride_on,
    NBITS: tl.constexpr, UNIT_BYTES: tl.constexpr, DECODE_GROUP: tl.constexpr,
    ELEM_BITS: tl.constexpr, LQ: tl.constexpr, QUERIES_PER_BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_T_TAIL: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D_BLOCKS: tl.constexpr, DOCS_PER_PROGRAM: tl.constexpr,
    HAS_PIDS: tl.constexpr, HAS_QUERY_LENGTHS: tl.constexpr,
    CENTROID_TABLE: tl.constexpr, PRECOMPUTED_NORMS: tl.constexpr, SPLIT_Q: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, EVEN_D: tl.constexpr,
    PTX_LOADS: tl.constexpr, PERSISTENT: tl.constexpr, PREFETCH: tl.constexpr,
    PIPELINE_CODES: tl.constexpr,
):
    """Q: [B, Lq, d] (strides q*); Q_lo (when SPLIT_Q): the fp16 tail of an fp32 query whose fp16
    head is Q, same strides; codes: [T] int32/int64, read clamped into [0, max_code = C - 1];
    units: the residual rows [T, d*NBITS/8] read as UNIT_BYTES-byte units (int32 words or uint8
    bytes; units_per_row per row, row stride stride_ut units); offsets: int64 [N+1]; pids: [M]
    (else 0..M-1); centroids: [C, d]; table: the pair table (DECODE_GROUP 2: [2**(2*NBITS)]
    int32/int64 of packed ELEM_BITS-bit weights), the bucket weights themselves (DECODE_GROUP 0:
    [2**NBITS], any float dtype: _permute_registers) or the field table (DECODE_GROUP 1:
    [2**NBITS] weights in the dot dtype, field order); inv_norms: [T] float (when
    PRECOMPUTED_NORMS); centroid_scores S: [C, B*Lq] fp32 or fp16, row stride stride_sc (when
    CENTROID_TABLE); query_lengths: [B]; out: fp32 [B, M]; counter (PERSISTENT, one query
    block): int32 [1], zero at launch, the next chunk of DOCS_PER_PROGRAM documents to score, of
    num_chunks."""
    # Query blocks vary fastest: programs reading the same documents run side by side, so every
    # document byte after the first read comes from L2.
    pid = tl.program_id(0)
    pid_qblock = pid % num_qblocks
    pid_docs = pid // num_qblocks
    BLOCK_Q: tl.constexpr = QUERIES_PER_BLOCK * LQ

    offs_b, offs_i, mask_r = _query_rows(pid_qblock, Lq, p_query_lengths, num_queries,
                                         HAS_QUERY_LENGTHS, LQ, QUERIES_PER_BLOCK)
    # Column of S for each query row (the table is [C, B * Lq], unpadded).
    offs_col = offs_b * Lq + offs_i
    mask_col = (offs_b < num_queries) & (offs_i < Lq)
    # [BLOCK_Q, BLOCK_D]: the first (for d <= BLOCK_D the only) chunk of the query block stays in
    # registers for every tile of every document of this program.
    offs_d0 = tl.arange(0, BLOCK_D)
    b_q0 = tl.load(p_q + offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt
                   + offs_d0[None, :] * stride_qd,
                   mask=mask_r[:, None] & (offs_d0[None, :] < dim), other=0.0)
    b_q0 = _columns_to_operand_order(b_q0, BLOCK_Q, BLOCK_D, DECODE_GROUP, NBITS)
    if SPLIT_Q:
        b_q0_lo = tl.load(p_q_lo + offs_b[:, None] * stride_qb + offs_i[:, None] * stride_qt
                          + offs_d0[None, :] * stride_qd,
                          mask=mask_r[:, None] & (offs_d0[None, :] < dim), other=0.0)
        b_q0_lo = _columns_to_operand_order(b_q0_lo, BLOCK_Q, BLOCK_D, DECODE_GROUP, NBITS)
    else:
        b_q0_lo = b_q0
    if DECODE_GROUP == 2:
        # The pair table holds the weights.
        w0 = 0.0
        w1 = 0.0
        w2 = 0.0
        w3 = 0.0
    elif DECODE_GROUP == 0:
        # The byte permutes' registers, from the bucket weights themselves.
        w0, w1, w2, w3 = _permute_registers(p_table, b_q0.dtype, NBITS)
    else:
        w0 = tl.load(p_table)
        w1 = tl.load(p_table + 1)
        w2 = tl.load(p_table + 2 % (1 << NBITS))
        w3 = tl.load(p_table + 3 % (1 << NBITS))
    if EVEN_D:
        pad_unit = 0
    else:
        # Units past d decode to the first finite weight rather than field 0's: a NaN or inf
        # weight then reaches only the tokens that use it (0 x NaN is NaN).
        pad_unit = _pad_unit(_first_finite_field(p_table, w0, w1, w2, w3, b_q0.dtype, NBITS,
                                                 DECODE_GROUP, ELEM_BITS), NBITS, UNIT_BYTES)
    if UNIT_BYTES == 4:
        p_units = p_units.to(tl.pointer_type(tl.int32))

    if PERSISTENT:
        # Chunks of DOCS_PER_PROGRAM documents go to whichever program asks next (an atomic
        # counter, zeroed by the host), so programs finish within about one chunk of each other
        # instead of the last wave of a static grid running alone.
        chunk = tl.atomic_add(p_counter, 1, sem="relaxed")
        while chunk < num_chunks:
            for doc_step in range(DOCS_PER_PROGRAM):
                _score_document(
                    chunk.to(tl.int64) * DOCS_PER_PROGRAM + doc_step, pid_qblock, b_q0, b_q0_lo,
                    offs_b, offs_i, mask_r, offs_col, mask_col, p_q, p_q_lo, p_codes, p_units,
                    p_offsets, p_pids, p_centroids, p_table, p_inv_norms, p_centroid_scores, p_out,
                    w0, w1, w2, w3, pad_unit, num_out_docs, num_queries, dim, units_per_row,
                    stride_qb, stride_qt, stride_qd, stride_ut, stride_cc, stride_cd, stride_sc,
                    max_code, stride_ob, stride_on, NBITS, UNIT_BYTES, DECODE_GROUP, ELEM_BITS, LQ,
                    QUERIES_PER_BLOCK, BLOCK_T, BLOCK_T_TAIL, BLOCK_Q, BLOCK_D, NUM_D_BLOCKS,
                    HAS_PIDS, CENTROID_TABLE, PRECOMPUTED_NORMS, SPLIT_Q, INPUT_PRECISION, UPCAST,
                    EVEN_D, PTX_LOADS, PREFETCH, PIPELINE_CODES)
            chunk = tl.atomic_add(p_counter, 1, sem="relaxed")
    else:
        # The static grid keeps a plain loop (no while, no atomic).
        for doc_step in range(DOCS_PER_PROGRAM):
            _score_document(
                pid_docs.to(tl.int64) * DOCS_PER_PROGRAM + doc_step, pid_qblock, b_q0, b_q0_lo,
                offs_b, offs_i, mask_r, offs_col, mask_col, p_q, p_q_lo, p_codes, p_units,
                p_offsets, p_pids, p_centroids, p_table, p_inv_norms, p_centroid_scores, p_out,
                w0, w1, w2, w3, pad_unit, num_out_docs, num_queries, dim, units_per_row,
                stride_qb, stride_qt, stride_qd, stride_ut, stride_cc, stride_cd, stride_sc,
                max_code, stride_ob, stride_on, NBITS, UNIT_BYTES, DECODE_GROUP, ELEM_BITS, LQ,
                QUERIES_PER_BLOCK, BLOCK_T, BLOCK_T_TAIL, BLOCK_Q, BLOCK_D, NUM_D_BLOCKS, HAS_PIDS,
                CENTROID_TABLE, PRECOMPUTED_NORMS, SPLIT_Q, INPUT_PRECISION, UPCAST, EVEN_D,
                PTX_LOADS, PREFETCH, PIPELINE_CODES)
