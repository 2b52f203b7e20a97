// What the CUDA MaxSim kernels share (maxsim_pq_mma.cu, maxsim_residual_mma.cu): the query
// held as the A operand of mma.sync.m16n8k16 (blocks of 16 rows), document tokens as B, a lane
// (g = lane / 4, quad q = lane % 4) keeping the running max of query rows g + 8j over its
// tokens, and documents found by offsets (and pids). Included by NVRTC (ops/nvrtc.py passes the
// kernels' folder).
// Needs ELEM ("f16" or "bf16") defined.

#pragma once

#define STR2(x) #x
#define STR(x) STR2(x)
#define NEG_INF __int_as_float(0xff800000)

// max(a, b) that propagates NaN, as torch's max (fmaxf drops a NaN operand): max.NaN.f32
// (sm_80 on), the same throughput as max.f32.
__device__ __forceinline__ float max_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

// c += A B for one k-block: a[0..3] the A fragment's registers, b0 and b1 the B fragment's.
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned* a, unsigned b0,
                                          unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." STR(ELEM) "." STR(ELEM) ".f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#define QUERY_REGS 64  // 8 k-blocks * 2 query blocks * 4 registers

// This lane's A fragments of the query's rows at ``q_rows`` (rows past ``query_rows`` zero):
// register r of (k-block kb, query block qb) at qf[(kb * 2 + qb) * 4 + r] holds query row
// qb * 16 + g + 8 (r % 2), product columns 2q + 8 (r / 2) + (0, 1), which are the dimensions
// dim_of(kb, q, r / 2) + (0, 1) of the kernel's column order.
template <typename DimOf>
__device__ __forceinline__ void load_query_fragments(unsigned (&qf)[QUERY_REGS],
                                                     const unsigned short* q_rows,
                                                     long long stride_qt, int query_rows, int g,
                                                     int q, DimOf dim_of) {
#pragma unroll
    for (int i = 0; i < QUERY_REGS; ++i) {
        const int kb = i >> 3, qb = (i >> 2) & 1, r = i & 3;
        const int row = qb * 16 + g + 8 * (r & 1);
        qf[i] = row < query_rows ? *reinterpret_cast<const unsigned*>(
            q_rows + row * stride_qt + dim_of(kb, q, r >> 1)) : 0u;
    }
}

// Output n's document: its first token and its length.
__device__ __forceinline__ void document_bounds(const long long* __restrict__ offsets,
                                                const long long* __restrict__ pids, int n,
                                                long long& start, int& length) {
    const long long doc = pids ? pids[n] : n;
    start = offsets[doc];
    const long long rows = offsets[doc + 1] - start;
    length = rows > 0 ? (int)rows : 0;  // an end before its start: an empty document
}

// Asks L2 for the 128-byte lines of ``bytes`` bytes from ``p``, a line per lane at a time.
__device__ __forceinline__ void prefetch_lines(const void* p, long long bytes, int lane) {
    const unsigned long long at = reinterpret_cast<unsigned long long>(p);
    const unsigned long long end = at + bytes;
    for (unsigned long long line = (at & ~127ull) + 128ull * lane; line < end; line += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
}

// A document's score from the warp's running maxima (best[j]: query row g + 8j over this lane's
// tokens; J = 4 for 32 rows), in every lane: the max over the quad's tokens, then the sum over
// the rows, a row past the query's length adding 0 (also to an empty document's -inf). Resets
// best to -inf.
template <int J>
__device__ __forceinline__ float document_score(float (&best)[J], const bool (&row_in_query)[J]) {
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
        float v = best[j];
        v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
        v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
        total += row_in_query[j] ? v : 0.f;
        best[j] = NEG_INF;
    }
    total += __shfl_xor_sync(0xffffffffu, total, 4);
    total += __shfl_xor_sync(0xffffffffu, total, 8);
    total += __shfl_xor_sync(0xffffffffu, total, 16);
    return total;
}
