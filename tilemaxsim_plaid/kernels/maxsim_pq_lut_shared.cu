// MaxSim over PQ codes by per-query lookup tables held in shared memory (the textbook PQ
// scorer, as the TileMaxSim paper fuses it):
//
//     LUT[r, m, k] = <Q_row_r^(m), codebooks[m, k]>                 (host, once per query batch)
//     score[b, n]  = sum_i max_t s_t * (S[c_t, i] + sum_m LUT[i, m, pq_t[m]])
//
// The host builds the tables of each tile of ROWS query rows in float64 and rounds them to fp32
// (ops/pq.py, the same tables as kernels/maxsim_pq_lut.py). A block stages one tile's table,
// M * 256 * ROWS fp32 (128 KB at M = 16, 8 rows), into shared memory once, and its warps then
// take documents from the tile's counter, GRAB at a time. A lane scores one token: M table rows
// of ROWS entries each, read from shared memory at the token's codes, summed per query row;
// with PLAID's codes also the centroid's score S[c_t, row] (from L2) and the token's inverse
// norm s_t. The warp keeps a running max per query row over the document's tokens, reduces it
// across lanes once per document and writes the sum over the tile's valid rows; the host adds
// the tiles of each query.
//
// Masking as everywhere: a token past its document's end is -inf, a query row past its query's
// length adds 0; an empty document scores -inf, an empty query 0.
// Every max propagates NaN (max_nan): a NaN in an input reaches exactly the scores it touches,
// as in torch (docs/kernels.md, NaN and inf).
//
// Defines: ROWS (query rows per tile: 1, 2, 4, 8 or 16), WARPS (warps per block), CODE_WORDS
// (1: a token's M codes are read as 32-bit words: M % 4 == 0, 4-byte aligned rows).

#ifndef ROWS
#define ROWS 8
#endif
#ifndef WARPS
#define WARPS 16
#endif
#ifndef CODE_WORDS
#define CODE_WORDS 1
#endif
#define NEG_INF __int_as_float(0xff800000)

// max(a, b) that propagates NaN, as torch's max (fmaxf drops a NaN operand): max.NaN.f32
// (sm_80 on), the same throughput as max.f32; before sm_80 a NaN operand is passed on by a + b.
__device__ __forceinline__ float max_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return (a != a || b != b) ? a + b : fmaxf(a, b);
#endif
}

// acc[r] += table row (m, code): ROWS consecutive fp32 in shared memory.
__device__ __forceinline__ void add_row(float (&acc)[ROWS], const float* table, int m,
                                        unsigned code) {
    const float* row = table + (m * 256 + code) * ROWS;
#if ROWS >= 4
#pragma unroll
    for (int r = 0; r < ROWS; r += 4) {
        const float4 v = *reinterpret_cast<const float4*>(row + r);
        acc[r] += v.x;
        acc[r + 1] += v.y;
        acc[r + 2] += v.z;
        acc[r + 3] += v.w;
    }
#else
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] += row[r];
#endif
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, 1)
maxsim_pq_lut_shared(const float* __restrict__ lut,             // [tiles, M * 256, ROWS]
                     const unsigned char* __restrict__ codes,   // [T, M] rows of code_stride
                     long long code_stride, int M,
                     const long long* __restrict__ offsets,     // [N + 1]
                     const long long* __restrict__ pids,        // [num_out] or null
                     const int* __restrict__ centroid_codes,    // [T] or null
                     const float* __restrict__ centroid_scores, // [C, B * Lq] with centroid codes
                     long long score_stride,
                     const float* __restrict__ inv_norms,       // [T] or null
                     const int* __restrict__ row_query,         // [tiles * ROWS]: S column
                     const int* __restrict__ row_valid,         // [tiles * ROWS]: 1 or 0
                     float* __restrict__ partial,               // [tiles, partial_stride]
                     long long partial_stride,
                     int* __restrict__ counters,                // [tiles], zero at launch
                     int num_out, int grab) {
    extern __shared__ float4 shared_words[];
    float* table = reinterpret_cast<float*>(shared_words);
    const int tile = blockIdx.y;
    const int table_words = M * 256 * ROWS / 4;
    const float4* tile_lut = reinterpret_cast<const float4*>(lut) + (long long)tile * table_words;
    for (int i = threadIdx.x; i < table_words; i += blockDim.x) shared_words[i] = tile_lut[i];

    const int lane = threadIdx.x & 31;
    bool valid[ROWS];
    int column[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        valid[r] = row_valid[tile * ROWS + r] != 0;
        column[r] = row_query[tile * ROWS + r];
    }
    __syncthreads();

    for (;;) {
        int first = 0;
        if (lane == 0) first = atomicAdd(counters + tile, grab);
        first = __shfl_sync(0xffffffffu, first, 0);
        if (first >= num_out) break;
        const int last = min(first + grab, num_out);
        for (int n = first; n < last; ++n) {
            const long long doc = pids ? pids[n] : n;
            const long long start = offsets[doc], end = offsets[doc + 1];
            float best[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) best[r] = NEG_INF;
            for (long long t = start + lane; t - lane < end; t += 32) {
                if (t >= end) continue;  // the last round's lanes past the end
                float acc[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
                const unsigned char* token_codes = codes + t * code_stride;
#if CODE_WORDS
                const unsigned* words = reinterpret_cast<const unsigned*>(token_codes);
                for (int w = 0; w < M / 4; ++w) {
                    const unsigned word = __ldg(words + w);
#pragma unroll
                    for (int j = 0; j < 4; ++j) add_row(acc, table, 4 * w + j, (word >> (8 * j)) & 0xffu);
                }
#else
                for (int m = 0; m < M; ++m) add_row(acc, table, m, __ldg(token_codes + m));
#endif
                if (centroid_scores) {
                    const float* scores = centroid_scores + (long long)centroid_codes[t] * score_stride;
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) acc[r] += __ldg(scores + column[r]);
                }
                const float scale = inv_norms ? inv_norms[t] : 1.f;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) best[r] = max_nan(best[r], acc[r] * scale);
            }
            float total = 0.f;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float v = best[r];
#pragma unroll
                for (int offset = 16; offset > 0; offset >>= 1)
                    v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, offset));
                total += valid[r] ? v : 0.f;
            }
            if (lane == 0) partial[tile * partial_stride + n] = total;
        }
    }
}
