// Exact MaxSim over PLAID residual codes (d = 128, nbits 2 or 4, the centroid-score table
// path), with the decode fed straight into mma.sync and every warp walking its own documents.
//
//     score[b, n] = sum_i max_t (S[code_t, i] + <Q[b, i], w[bucket_t]>) * inv_norm[t]
//
// S = centroids @ Q^T is the per-query centroid-score table (ops/residual_mma builds it with its
// query columns permuted, below), w the bucket weights rounded to Q's dtype.
//
// Why CUDA and not Triton: the Triton kernel (kernels/maxsim_residual.py) decodes each tile in
// the layout tl.dot asks for and spends most of its instructions moving weights into it. Here a
// lane decodes exactly the B fragment it multiplies: one shared-memory load per residual byte
// and nothing else.
//
// Products: S'^T = Q R^T by m16n8k16, the query as A (2 blocks of 16 query rows) and 8
// document tokens as B. Lane (token g = lane / 4, quad q = lane % 4) holds, of token g, product
// columns 2q, 2q+1 (first register) and 2q+8, 2q+9 (second) of each of the 8 k-blocks: 16
// registers of two weights. In the product column order (ops/residual_mma.mma_column_order)
// those are dimensions 32q .. 32q+31 of the token, in order: register j = 2 kb + r holds
// dimensions 32q + 2j, 32q + 2j + 1. So lane (g, q) decodes the q-th quarter of token g's
// residual row (8 bytes at nbits 2, 16 at nbits 4), one vector load; the quad reads the row
// whole. The query's A fragments are loaded in the same column order (ops/residual_mma.
// mma_query_fragments is that layout, on the CPU), which leaves every <q, r> unchanged.
//
// Decode: a residual byte is 4 dimensions (nbits 2) or 2 (nbits 4) in colbert-ai's bit order.
// A 256-entry table in shared memory maps a byte to their weights in Q's dtype, as the B
// registers hold them (two registers at nbits 2, one at nbits 4; ops/residual_mma.byte_table).
// Every entry is kept in COPIES copies, a lane reading copy lane % COPIES: whatever the bytes,
// the warp's loads fall in distinct banks (one wavefront; LDS.64 in two half-warp phases).
//
// Centroid part: lane (g, q)'s products are query rows g + 8j (j = 0..3: row g and g + 8 of
// both query blocks) against tokens 2q, 2q+1 of the 8. The table's query columns are stored in
// the order 4g + j <- row g + 8j, so a lane gathers its four entries of a token with one load.
//
// Documents: a warp takes GRAB consecutive outputs from a per-query counter (claimed a grab
// ahead) and walks each document in 16-token tiles, two halves of 8 (a half wholly past the
// document's end is skipped); the next document's bounds are read while one is scored, and
// (PREFETCH) after the scored one's first tile the next one's rows, codes and inverse norms
// are prefetched into L2. The next tile's residual rows, codes and inverse norms are loaded
// before the current tile's products, and its table entries (which wait on its codes) after
// them.
//
// Masking as everywhere: a token past its document's end is -inf, a query row past the query's
// length adds 0 (also to an empty document's -inf); an empty document is -inf. Every max
// propagates NaN (max_nan): a NaN in an input reaches exactly the scores it touches, as in
// torch (docs/kernels.md, NaN and inf). Codes are clamped into [0, C) where their entries are
// gathered (the op judges them after the launch).
//
// Defines: WARPS (warps per block), MIN_BLOCKS (blocks per SM the registers must allow), ELEM
// ("f16" or "bf16"), NBITS (2 or 4), TABLE_F32 (1: the table is fp32, else fp16), CODES_I64
// (1: int64 codes, else int32), PREFETCH (1: documents into L2 a document ahead), L2_HINTS (1:
// the table's lines kept in L2 before the streamed rows, codes and norms), CHAINS.

#ifndef WARPS
#define WARPS 16
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef ELEM
#define ELEM f16
#endif
#ifndef NBITS
#define NBITS 2
#endif
#ifndef TABLE_F32
#define TABLE_F32 0
#endif
#ifndef CODES_I64
#define CODES_I64 0
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef L2_HINTS
#define L2_HINTS 0
#endif
#include "mma_common.cuh"

// Independent accumulations per query block (k-blocks kb % CHAINS): two overlap the products'
// latency at nbits 2 beside the fp16 table; elsewhere (the longer decode at nbits 4, the fp32
// table's entries) one keeps 16 warps within 128 registers.
#ifndef CHAINS
#define CHAINS (NBITS == 2 && !TABLE_F32 ? 2 : 1)
#endif
#define ROW_BYTES (128 * NBITS / 8)    // one token's residual row
#define LANE_BYTES (ROW_BYTES / 4)     // a lane's quarter of it: 8 or 16
#define ENTRY_WORDS (NBITS == 2 ? 2 : 1)
#define COPIES (NBITS == 2 ? 16 : 32)

#if CODES_I64
typedef long long code_t;
#else
typedef int code_t;
#endif

#if NBITS == 2
typedef uint2 lane_bytes_t;
#else
typedef uint4 lane_bytes_t;
#endif

// One tile's loads for this lane: its residual quarter of tokens g and 8 + g, and the codes and
// inverse norms of tokens 2q, 2q + 1, 8 + 2q, 8 + 2q + 1 (the columns of its products). A token
// past the document's end reads the document's last token instead (an empty document's, the
// index's first), so no load is masked: the products of such tokens are masked after them.
// Codes are kept as read and clamped into [0, C) where their table entries are loaded, so
// nothing waits on them before then.
struct Tile {
    lane_bytes_t bits[2];
    code_t code[4];
    float inv[4];
};

// A load of data read once (residual rows, codes, inverse norms): with L2_HINTS, ld.global.cs
// (evict first in L1 and L2), so the streamed lines leave L2 before the table's.
template <typename T>
__device__ __forceinline__ T load_streamed(const T* p) {
#if L2_HINTS
    return __ldcs(p);
#else
    return __ldg(p);
#endif
}

__device__ __forceinline__ int clamp_code(code_t c, int max_code) {
    return c < 0 ? 0 : (c > max_code ? max_code : (int)c);
}

// ``start``: the document's first token (0 for an empty document); ``first``: the tile's first
// token's position in it; ``last``: its last token's position (0 for an empty document).
__device__ __forceinline__ void load_tile(Tile& t, const unsigned char* __restrict__ residuals,
                                          const code_t* __restrict__ codes,
                                          const float* __restrict__ inv_norms, long long start,
                                          int first, int last, int g, int q) {
    const unsigned char* rows = residuals + start * ROW_BYTES + q * LANE_BYTES;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = min(first + 8 * h + g, last);
        t.bits[h] = load_streamed(reinterpret_cast<const lane_bytes_t*>(rows + i * ROW_BYTES));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int k = min(first + 8 * h + 2 * q + e, last);
            t.code[2 * h + e] = load_streamed(codes + start + k);
            t.inv[2 * h + e] = load_streamed(inv_norms + start + k);
        }
    }
}

// A document's residual rows, codes and inverse norms into L2, read a document ahead: its
// tiles' loads then wait on L2, not on HBM.
__device__ __forceinline__ void prefetch_document(const unsigned char* __restrict__ residuals,
                                                  const code_t* __restrict__ codes,
                                                  const float* __restrict__ inv_norms,
                                                  long long start, int length, int lane) {
    prefetch_lines(residuals + start * ROW_BYTES, (long long)length * ROW_BYTES, lane);
    prefetch_lines(codes + start, (long long)length * sizeof(code_t), lane);
    prefetch_lines(inv_norms + start, (long long)length * sizeof(float), lane);
}

// The low and high fp16 halves of a word as fp32.
__device__ __forceinline__ float2 halves(unsigned v) {
    float lo, hi;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(lo), "=f"(hi) : "r"(v));
    return make_float2(lo, hi);
}

// The four table entries of a token (query rows g, g + 8, g + 16, g + 24), as stored, at byte
// offset code * stride_bytes from this lane's first entry (32-bit: the host checks it fits).
#if TABLE_F32
typedef float4 entries_t;
#else
typedef uint2 entries_t;
#endif

// With L2_HINTS the table's lines are loaded under an L2 evict_last policy.
__device__ __forceinline__ entries_t load_entries(const char* __restrict__ table, int code,
                                                  unsigned stride_bytes) {
    const entries_t* p = reinterpret_cast<const entries_t*>(table + (unsigned)code * stride_bytes);
#if L2_HINTS
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    entries_t v;
#if TABLE_F32
    asm("ld.global.nc.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(policy));
#else
    asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
        : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(policy));
#endif
    return v;
#else
    return __ldg(p);
#endif
}

__device__ __forceinline__ float4 entries_f32(entries_t v) {
#if TABLE_F32
    return v;
#else
    const float2 a = halves(v.x), b = halves(v.y);
    return make_float4(a.x, a.y, b.x, b.y);
#endif
}

// The shared-memory byte offset of this lane's copy of byte I of ``word``'s entries: 128 bytes
// per byte value (COPIES copies of ENTRY_WORDS words), ``lane_bits`` the copy's offset in them.
// One shift and one three-input logic op.
template <int I>
__device__ __forceinline__ unsigned entry_offset(unsigned word, unsigned lane_bits) {
    const unsigned shifted = I == 0 ? word << 7 : word >> (8 * I - 7);
    return (shifted & 0x7f80u) | lane_bits;
}

// Lane (g, q)'s B fragments of one half-tile (8 tokens): token g's q-th quarter of its residual
// row decoded by the shared-memory byte table, 16 registers of two weights.
__device__ __forceinline__ void decode_half(unsigned (&b)[16], lane_bytes_t bits,
                                            const char* byte_entries, unsigned lane_bits) {
#if NBITS == 2
    const unsigned words[2] = {bits.x, bits.y};
#pragma unroll
    for (int w = 0; w < 2; ++w) {
        const unsigned offsets4[4] = {
            entry_offset<0>(words[w], lane_bits), entry_offset<1>(words[w], lane_bits),
            entry_offset<2>(words[w], lane_bits), entry_offset<3>(words[w], lane_bits)};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint2 e = *reinterpret_cast<const uint2*>(byte_entries + offsets4[i]);
            b[8 * w + 2 * i] = e.x;
            b[8 * w + 2 * i + 1] = e.y;
        }
    }
#else
    const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const unsigned offsets4[4] = {
            entry_offset<0>(words[w], lane_bits), entry_offset<1>(words[w], lane_bits),
            entry_offset<2>(words[w], lane_bits), entry_offset<3>(words[w], lane_bits)};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            b[4 * w + i] = *reinterpret_cast<const unsigned*>(byte_entries + offsets4[i]);
    }
#endif
}

// One half-tile's products and running maxima: tokens 2q, 2q + 1 of the half (``entries`` and
// ``inv`` theirs), ``half_left`` the document's tokens from the half's first on.
__device__ __forceinline__ void score_half(float (&best)[4], const unsigned (&qf)[QUERY_REGS],
                                           const unsigned (&b)[16], const entries_t* entries,
                                           const float* inv, int half_left, int q) {
    // CHAINS chains per query block (k-blocks kb % CHAINS) overlap the products' latency.
    // Register 2r + e of block qb is row g + 8 (2qb + r), token 2q + e.
    float acc[2][CHAINS][4];
#pragma unroll
    for (int qb = 0; qb < 2; ++qb)
#pragma unroll
        for (int c = 0; c < CHAINS; ++c)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[qb][c][j] = 0.f;
#pragma unroll
    for (int kb = 0; kb < 8; ++kb)
#pragma unroll
        for (int qb = 0; qb < 2; ++qb)
            mma_16816(acc[qb][kb % CHAINS], qf + (kb * 2 + qb) * 4, b[2 * kb], b[2 * kb + 1]);
#pragma unroll
    for (int qb = 0; qb < 2; ++qb)
#pragma unroll
        for (int c = 1; c < CHAINS; ++c)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[qb][0][j] += acc[qb][c][j];
    // Token 2q + e of the half: (S + <q, r>) * inv_norm for rows g + 8j, j = 2qb + r. A token
    // past the end is -inf, selected after the products (a product may be NaN or inf, and
    // -inf + NaN would let it win the max).
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const bool in = 2 * q + e < half_left;
        const float4 s = entries_f32(entries[e]);
        const float entry[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
        for (int qb = 0; qb < 2; ++qb)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int j = 2 * qb + r;
                const float v = (entry[j] + acc[qb][0][2 * r + e]) * inv[e];
                best[j] = max_nan(best[j], in ? v : NEG_INF);
            }
    }
}

// A 16-token tile's two halves (a half wholly past the document's end is skipped: ``left``, the
// document's tokens from the tile's first on, is the same for the whole warp).
__device__ __forceinline__ void score_tile(float (&best)[4], const unsigned (&qf)[QUERY_REGS],
                                           const Tile& tile, const entries_t (&entries)[4],
                                           int left, const char* byte_entries,
                                           unsigned lane_bits, int q) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int half_left = left - 8 * half;
        if (half == 1 && half_left <= 0) break;
        unsigned b[16];
        decode_half(b, tile.bits[half], byte_entries, lane_bits);
        score_half(best, qf, b, entries + 2 * half, tile.inv + 2 * half, half_left, q);
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
maxsim_residual_mma(const unsigned short* __restrict__ Q,      // [B, Lq, 128] ELEM
                    long long stride_qb, long long stride_qt,  // in elements, even
                    int num_query_rows,                        // Lq <= 32
                    const int* __restrict__ query_lengths,     // [B] or null: all Lq rows
                    int row_start,                             // query_lengths count from here
                    const unsigned* __restrict__ byte_table,   // [256][ENTRY_WORDS]
                    const unsigned char* __restrict__ residuals,  // [T, ROW_BYTES], 16-aligned
                    const code_t* __restrict__ codes,          // [T]
                    const float* __restrict__ inv_norms,       // [T]
                    const void* __restrict__ table,            // [C, B * 32] permuted columns
                    unsigned table_stride_bytes,               // bytes per code
                    int max_code,                              // C - 1
                    const long long* __restrict__ offsets,     // [N + 1]
                    const long long* __restrict__ pids,        // [num_out] or null
                    float* __restrict__ out,                   // [B][out_stride]
                    long long out_stride,
                    int* __restrict__ counters,                // [B], zero at launch
                    int num_out, int grab) {
    extern __shared__ unsigned shared_table[];
    for (int e = threadIdx.x; e < 256 * COPIES; e += blockDim.x) {
        const int byte = e / COPIES;
#pragma unroll
        for (int w = 0; w < ENTRY_WORDS; ++w)
            shared_table[e * ENTRY_WORDS + w] = byte_table[byte * ENTRY_WORDS + w];
    }

    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int q = lane & 3;
    const char* byte_entries = reinterpret_cast<const char*>(shared_table);
    const unsigned lane_bits = 4 * ENTRY_WORDS * (lane % COPIES);  // this lane's copy
    const int query = blockIdx.y;
    const int query_rows = query_lengths
        ? min(max(query_lengths[query] - row_start, 0), num_query_rows) : num_query_rows;

    // The query's A fragments; in the product column order, column pair (kb, q, p) is
    // dimensions 32q + 4kb + 2p + (0, 1).
    unsigned qf[QUERY_REGS];
    load_query_fragments(qf, Q + query * stride_qb, stride_qt, query_rows, g, q,
                         [](int kb, int q, int p) { return 32 * q + 4 * kb + 2 * p; });
    const char* query_table = static_cast<const char*>(table)
        + (query * 32 + 4 * g) * (TABLE_F32 ? 4 : 2);
    float* out_row = out + query * out_stride;
    bool row_in_query[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) row_in_query[j] = g + 8 * j < query_rows;
    // Running max of query rows g + 8j over this lane's tokens.
    float best[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) best[j] = NEG_INF;
    __syncthreads();

    // Grabs are claimed one ahead (lane 0's atomic is waited for only when the grab before it is
    // done), and each document's bounds are read while the one before it is scored.
    int claimed = lane == 0 ? atomicAdd(counters + query, grab) : 0;
    for (;;) {
        const int first = __shfl_sync(0xffffffffu, claimed, 0);
        if (first >= num_out) break;
        if (lane == 0) claimed = atomicAdd(counters + query, grab);
        const int last = min(first + grab, num_out);

        int n = first;
        long long start;
        int left;
        document_bounds(offsets, pids, n, start, left);
        long long after_start = 0;  // document n + 1's, where it is in the grab
        int after_left = 0;
        if (n + 1 < last) document_bounds(offsets, pids, n + 1, after_start, after_left);
        bool after_asked = false;  // whether document n + 1 was prefetched into L2
        // Loads read tokens from ``safe_start`` to ``safe_start + safe_last`` only.
        long long safe_start = left > 0 ? start : 0;
        int safe_last = max(left - 1, 0);
        int position = 0;  // of the tile's first token in the document
        Tile next;
        load_tile(next, residuals, codes, inv_norms, safe_start, 0, safe_last, g, q);
        // The table entries of the next tile's tokens, loaded a tile ahead like its codes.
        entries_t next_entries[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            next_entries[k] = load_entries(query_table, clamp_code(next.code[k], max_code),
                                           table_stride_bytes);

        for (;;) {
            const Tile tile = next;
            const int tile_left = left;
            const int n_tile = n;
            entries_t entries[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) entries[k] = next_entries[k];
            position += 16;
            left -= 16;
            const bool doc_done = left <= 0;
            if (doc_done && ++n < last) {
                start = after_start;
                left = after_left;
                safe_start = left > 0 ? start : 0;
                safe_last = max(left - 1, 0);
                position = 0;
                if (n + 1 < last) document_bounds(offsets, pids, n + 1, after_start, after_left);
                after_asked = false;
            }
            if (n < last)
                load_tile(next, residuals, codes, inv_norms, safe_start, position, safe_last, g,
                          q);

            score_tile(best, qf, tile, entries, tile_left, byte_entries, lane_bits, q);

            if (n < last) {
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    next_entries[k] = load_entries(query_table, clamp_code(next.code[k], max_code),
                                                   table_stride_bytes);
            }
            // After a tile's products, by when document n + 1's bounds have arrived.
            if (PREFETCH && !after_asked && n + 1 < last) {
                prefetch_document(residuals, codes, inv_norms, after_start, after_left, lane);
                after_asked = true;
            }

            if (doc_done) {
                const float total = document_score(best, row_in_query);
                if (lane == 0) out_row[n_tile] = total;
                if (n >= last) break;
            }
        }
    }
}
