// Exact MaxSim over PQ codes (M = 16 sub-quantizers of 8 dimensions, d = 128, 256 centroids),
// with the decode fed straight into mma.sync and every warp walking its own documents.
//
//     score[b, n] = sum_i max_t <Q[b, i], concat_m codebooks[m, codes[t, m]]>
//
// Why CUDA and not Triton: Triton cannot index shared memory at run-time addresses and runs a
// program's warps in step, so its PQ kernel (kernels/maxsim_pq.py) gives every one-warp program
// its own path to the codebook through L1. Here each warp keeps its own loop over documents, the
// codebook is one shared copy per block, and a tile costs 8 shared loads and 32 tensor-core
// products.
//
// Products: S^T = Q D^T by m16n8k16, the query as A (2 blocks of 16 query tokens) and 8
// document tokens as B. A B fragment is one token's: lane (token g = lane / 4, quad q = lane % 4)
// holds k columns 2q, 2q+1 and 2q+8, 2q+9 of token g, two consecutive registers. One 16-byte
// codebook entry, sub-quantizer 4h + q of token g, is dims 0..7 as four fp16 pairs: pairs 0, 1
// are the B fragment of product k-block 2h, pairs 2, 3 that of k-block 2h + 1. So a gather lands
// in the registers the products read, with no moves. Each lane loads its query fragments in the
// same column order at the start (ops/pq_mma.mma_query_fragments is that layout, on the CPU), which
// leaves every <q, x> unchanged.
//
// Codebook in shared memory, free of bank conflicts, staged by each block from the [16, 256, 8]
// codebook (fp32 ones rounded to the query's dtype on the way; ops/pq_mma.mma_codebook_lines is
// the layout, on the CPU). A 128-byte
// line holds entry `code` of sub-quantizers 4h..4h+3, twice each: slot 2q + p is sub-quantizer
// 4h + q, copy p. Lane (g, q) reads slot 2q + (g & 1), so the 8 lanes of a quarter-warp (tokens
// 2i and 2i+1, quads 0..3) read 8 distinct 16-byte bank groups whatever the codes: one wavefront
// per quarter-warp. 2 copies * 16 * 256 * 8 * 2 B = 128 KB.
//
// Documents: a warp takes GRAB consecutive outputs from a per-query counter and walks each
// document in 16-token tiles, two halves of 8 (a half wholly past the document's end is
// skipped). Lane (g, q)'s products hold query rows g, g + 8 (+16) against tokens 2q, 2q + 1 of
// the half; it keeps their running max over the document, and the max over the quad and the sum
// over query rows are taken once per document. The next tile's codes are loaded before the
// current tile's products, so their global-load latency overlaps the arithmetic.
//
// Masking as everywhere: a token past its document's end is -inf, a query row past the query's
// length is zero and adds 0 (also to an empty document's -inf); an empty document is -inf.
// Every max propagates NaN (max_nan): a NaN in an input reaches exactly the scores it touches,
// as in torch (docs/kernels.md, NaN and inf).
//
// Defines: WARPS (warps per block), ELEM ("f16" or "bf16"), BOOK_F32 (1: the codebook is fp32).

#ifndef WARPS
#define WARPS 16
#endif
#ifndef ELEM
#define ELEM f16
#endif
// Independent accumulations per query block and 8-token half: the second chain overlaps the
// products' latency (one chain was measured slower: results/PERFORMANCE_LOG.md, run 77).
#define CHAINS 2
#ifndef BOOK_F32
#define BOOK_F32 0
#endif
#include "mma_common.cuh"


// A codebook entry: the 16 bytes at shared address `address` + H * 32 KB (line group H).
template <int H>
__device__ __forceinline__ uint4 load_entry(unsigned address) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4 + %5];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(address), "n"(H * 32768));
    return v;
}

// Two fp32 values rounded to ELEM (to nearest even, as torch's .to()) in one register, `lo`
// in the low half.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned d;
    asm("cvt.rn." STR(ELEM) "x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// Codes of token i of a document whose tokens start at p, or zeros past its `left` tokens.
__device__ __forceinline__ uint4 load_codes(const uint4* __restrict__ p, int i, int left) {
    return i < left ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, 1)
maxsim_pq16_mma(const unsigned short* __restrict__ Q,      // [B, Lq, 128], rows of 128
                long long stride_qb, long long stride_qt,  // in elements, even
                int num_query_rows,                        // Lq <= 32
                const int* __restrict__ query_lengths,     // [B] or null: all Lq rows
                int row_start,                             // query_lengths count from this row
                const void* __restrict__ codebooks,        // [16, 256, 8] ELEM, or fp32
                const uint4* __restrict__ codes,           // [T]: 16 code bytes per token
                const long long* __restrict__ offsets,     // [N + 1]
                const long long* __restrict__ pids,        // [num_out] or null: all documents
                float* __restrict__ out,                   // [B][out_stride]
                long long out_stride,
                int* __restrict__ counters,                // [B], zero at launch
                int num_out, int grab) {
    extern __shared__ uint4 book[];
    // Entry (m, code) into slots 2 (m % 4) and 2 (m % 4) + 1 of line (m / 4, code).
    for (int e = threadIdx.x; e < 16 * 256; e += blockDim.x) {
#if BOOK_F32
        const float4 lo = static_cast<const float4*>(codebooks)[2 * e];
        const float4 hi = static_cast<const float4*>(codebooks)[2 * e + 1];
        const uint4 entry = make_uint4(pack2(lo.x, lo.y), pack2(lo.z, lo.w), pack2(hi.x, hi.y),
                                       pack2(hi.z, hi.w));
#else
        const uint4 entry = static_cast<const uint4*>(codebooks)[e];
#endif
        const int m = e >> 8, code = e & 255;
        uint4* slots = book + ((m >> 2) * 256 + code) * 8 + 2 * (m & 3);
        slots[0] = entry;
        slots[1] = entry;
    }

    const int lane = threadIdx.x & 31;
    const int token = lane >> 2;
    const int quad = lane & 3;
    // This lane's slot in line 0 (shared address); line (h, code) is 128 * (h * 256 + code) on.
    const unsigned slot_address =
        (unsigned)__cvta_generic_to_shared(book) + 16 * (2 * quad + (token & 1));
    const unsigned code_byte = 0x4440 | quad;  // __byte_perm selector: byte `quad`, zeros above
    const int query = blockIdx.y;
    const int query_rows = query_lengths
        ? min(max(query_lengths[query] - row_start, 0), num_query_rows) : num_query_rows;

    // A fragments, as load_query_fragments (mma_common.cuh) lays them out, written out here (the
    // compiled code was checked on the GPU in this form): in the product column order,
    // sub-quantizer 4 (kb / 2) + q, dims 4 (kb % 2) + 2 (r / 2) + (0, 1).
    unsigned qf[QUERY_REGS];
    const unsigned short* q_rows = Q + query * stride_qb;
#pragma unroll
    for (int i = 0; i < QUERY_REGS; ++i) {
        const int kb = i >> 3, qb = (i >> 2) & 1, r = i & 3;
        const int row = qb * 16 + token + 8 * (r & 1);
        const int dim = (4 * (kb >> 1) + quad) * 8 + 4 * (kb & 1) + 2 * (r >> 1);
        qf[i] = row < query_rows
            ? *reinterpret_cast<const unsigned*>(q_rows + row * stride_qt + dim) : 0u;
    }
    float* out_row = out + query * out_stride;
    // Query rows this lane's maxima belong to (g, g + 8, g + 16, g + 24): a row past the
    // query's length adds 0, even to an empty document's -inf.
    bool row_in_query[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) row_in_query[i] = token + 8 * i < query_rows;
    __syncthreads();

    for (;;) {
        int first = 0;
        if (lane == 0) first = atomicAdd(counters + query, grab);
        first = __shfl_sync(0xffffffffu, first, 0);
        if (first >= num_out) break;
        const int last = min(first + grab, num_out);

        int n = first;
        // The document being read: its first token's codes and its tokens left from there.
        long long doc = pids ? pids[n] : n;
        const uint4* p = codes + offsets[doc];
        int left = (int)(offsets[doc + 1] - offsets[doc]);
        uint4 codes_lo = load_codes(p, token, left);
        uint4 codes_hi = load_codes(p, 8 + token, left);
        // Running max of query rows g, g + 8, g + 16, g + 24 over this lane's tokens.
        float best[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) best[i] = NEG_INF;

        for (;;) {
            const uint4 tile_codes[2] = {codes_lo, codes_hi};
            const int tile_left = left;
            const int n_tile = n;
            p += 16;
            left -= 16;
            const bool doc_done = left <= 0;
            if (doc_done && ++n < last) {
                doc = pids ? pids[n] : n;
                p = codes + offsets[doc];
                left = (int)(offsets[doc + 1] - offsets[doc]);
            }
            if (n < last) {
                codes_lo = load_codes(p, token, left);
                codes_hi = load_codes(p, 8 + token, left);
            }

#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int half_left = tile_left - 8 * half;
                if (half == 1 && half_left <= 0) break;  // the same for the whole warp
                // This lane's tokens 2q, 2q + 1 of the half: in the document, or past its end.
                const bool in0 = 2 * quad < half_left;
                const bool in1 = 2 * quad + 1 < half_left;
                // acc[qb] sums the products of sub-quantizer groups h with h % CHAINS == 0,
                // acc[2 + qb] (CHAINS == 2) the others: independent chains of products.
                float acc[2 * CHAINS][4];
#pragma unroll
                for (int k = 0; k < 2 * CHAINS; ++k)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[k][j] = 0.f;
                const uint4& c = tile_codes[half];
                const uint4 w[4] = {
                    load_entry<0>(slot_address + (__byte_perm(c.x, 0, code_byte) << 7)),
                    load_entry<1>(slot_address + (__byte_perm(c.y, 0, code_byte) << 7)),
                    load_entry<2>(slot_address + (__byte_perm(c.z, 0, code_byte) << 7)),
                    load_entry<3>(slot_address + (__byte_perm(c.w, 0, code_byte) << 7))};
#pragma unroll
                for (int h = 0; h < 4; ++h)
#pragma unroll
                    for (int qb = 0; qb < 2; ++qb) {
                        const unsigned* a0 = qf + ((2 * h) * 2 + qb) * 4;
                        const unsigned* a1 = qf + ((2 * h + 1) * 2 + qb) * 4;
                        float (&sum)[4] = acc[qb + 2 * (h % CHAINS)];
                        mma_16816(sum, a0, w[h].x, w[h].y);
                        mma_16816(sum, a1, w[h].z, w[h].w);
                    }
#pragma unroll
                for (int k = 2; k < 2 * CHAINS; ++k)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[k - 2][j] += acc[k][j];
                // A token past the end is -inf, selected after the products: a product may
                // be NaN or inf (a NaN or inf in Q or the codebook, codes 0 past the end), and
                // -inf + NaN would let it win the max.
#pragma unroll
                for (int qb = 0; qb < 2; ++qb)
#pragma unroll
                    for (int r = 0; r < 2; ++r)
                        best[2 * qb + r] = max_nan(best[2 * qb + r],
                                                   max_nan(in0 ? acc[qb][2 * r] : NEG_INF,
                                                           in1 ? acc[qb][2 * r + 1] : NEG_INF));
            }

            if (doc_done) {
                const float total = document_score(best, row_in_query);
                if (lane == 0) out_row[n_tile] = total;
                if (n >= last) break;
            }
        }
    }
}
