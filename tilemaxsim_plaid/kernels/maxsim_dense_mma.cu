// Exact MaxSim over packed 16-bit documents on mma.sync: d a multiple of 64, up to 64 query rows
// a launch, every warp walking its own documents, each lane loading the tensor-core operand it
// multiplies straight from global memory.
//
//     score[b, n] = sum_i max_t <Q[b, i], D[t]>     (t over document n's rows)
//
// Why CUDA and not Triton: tl.dot takes the document tile through shared memory (a store and a
// load of every element on top of its read) in tiles whose shape follows d and the query's
// length, padded to powers of two. Here a lane's vector loads of its own segments of a row are
// its operand, whatever d (a multiple of 64) and however many query rows.
//
// Column order: the products' k index runs over d in an order of the kernel's, the same for the
// query and the documents, which leaves every <q, t> unchanged. Chunk c of 64 columns gives lane
// quad q 16 columns of its token in two 16-byte loads, load l of columns 64c + 32l + 8q .. + 7:
// each of a warp's loads reads 8 rows' contiguous 64-byte segments whole, the two a 128-byte
// line. Word r of the lane's chunk (columns + 2r, + 2r + 1 of its loads in order) is B register
// r % 2 of k-block 4c + r / 2, the product columns 2q + 8 (r % 2) + (0, 1) of mma.m16n8k16
// (ops/dense_mma.mma_column_order).
//
// Query: QUERY_BLOCKS blocks of 16 rows, stored once per block in shared memory as each lane's
// A fragments (block, k-block, lane; rows past the query's length zero): one 16-byte load per
// block and k-block, shared by both halves of a tile.
//
// Documents: a warp takes GRAB consecutive outputs from a per-query counter (claimed a grab
// ahead) and walks each document in 16-token tiles of two halves of 8 (lane g loads token g of
// each; a half wholly past the document's end is neither loaded nor multiplied), a tile chunk by
// chunk. Its loads run DEPTH (tile, chunk) steps ahead of its products, across tiles, documents
// and grabs, so the pipeline never drains, and each next document's bounds are read while the
// one before it is walked. No document is prefetched into L2: a document ahead for every warp
// of the GPU outgrows L2 at d >= 128 (results/PERFORMANCE_LOG.md, run 158).
//
// Masking as everywhere: a token past its document's end is -inf, selected after the products
// (a product may be NaN or inf, and -inf + NaN would let it win); a query row past the query's
// length adds 0 (also to an empty document's -inf); an empty document is -inf. Every max
// propagates NaN (max_nan): a NaN in an input reaches exactly the scores it touches, as in
// torch (docs/kernels.md, NaN and inf). A load past the document's end reads its last token.
//
// Defines: WARPS (warps per block, one block per SM), ELEM ("f16" or "bf16"), DIM (a multiple of
// 64), QUERY_BLOCKS (1 to 4), DEPTH (steps loaded ahead).

#ifndef WARPS
#define WARPS 16
#endif
#ifndef ELEM
#define ELEM f16
#endif
#ifndef DIM
#define DIM 128
#endif
#ifndef QUERY_BLOCKS
#define QUERY_BLOCKS 2
#endif
#ifndef DEPTH
#define DEPTH 2
#endif
#include "mma_common.cuh"

#define CHUNKS (DIM / 64)
#define KBLOCKS (DIM / 16)
#define ROWS (2 * QUERY_BLOCKS)  // a lane's query rows g + 8j

static_assert(DIM % 64 == 0, "DIM is a multiple of 64");
static_assert(QUERY_BLOCKS >= 1 && QUERY_BLOCKS <= 4, "QUERY_BLOCKS is 1 to 4");

// A lane's 16 columns of a chunk: loads lo and hi, four words each.
struct Words {
    uint4 lo, hi;
};

__device__ __forceinline__ void load_words(Words& w, const unsigned short* p) {
    w.lo = __ldg(reinterpret_cast<const uint4*>(p));
    w.hi = __ldg(reinterpret_cast<const uint4*>(p + 32));
}

// Word r of a lane's chunk (register r % 2 of k-block r / 2 of the chunk).
__device__ __forceinline__ unsigned word(const Words& w, int r) {
    const uint4& v = r < 4 ? w.lo : w.hi;
    r &= 3;
    return r == 0 ? v.x : r == 1 ? v.y : r == 2 ? v.z : v.w;
}

// The dimension of product column pair (k-block kb, quad q, register h) (+ 0, + 1): word
// r = 2 (kb % 4) + h of chunk kb / 4, in load r / 4.
__device__ __forceinline__ int dim_of(int kb, int q, int h) {
    const int r = 2 * (kb % 4) + h;
    return (kb / 4) * 64 + (r / 4) * 32 + q * 8 + 2 * (r % 4);
}

// One step of a warp's walk: one chunk of one 16-token tile.
struct Step {
    Words w[2];  // this lane's words of token g of each half
    int chunk;
    int left;    // tokens of the document from the tile's first on (<= 0: an empty one)
    int out;     // the document's output index; -1 past the warp's last
};

// Where the loads are: document ``n`` (first row ``start``, ``length`` rows) of the grab ending
// before ``grab_end``, the tile at ``position``, chunk ``chunk``; ``n >= num_out`` once every
// document is claimed. The document after it (``next_*``: the grab's next one, or the first of
// the grab claimed ahead) has its bounds read a document ahead, so entering it waits on nothing.
struct Cursor {
    int n, grab_end, length, position, chunk;
    int next_n, next_grab_end, next_length, claimed;
    long long start, next_start;
};

struct Walk {
    const long long* __restrict__ offsets;
    const long long* __restrict__ pids;
    int* __restrict__ counter;
    const unsigned short* __restrict__ D;
    long long stride_row;
    int num_out, grab, lane;

    // The document after ``n``; its bounds' loads are issued here and read when it is entered.
    __device__ __forceinline__ void find_next(Cursor& c) const {
        if (c.n + 1 < c.grab_end) {
            c.next_n = c.n + 1;
            c.next_grab_end = c.grab_end;
        } else {  // the grab claimed ahead (lane 0's atomic), and another claimed
            c.next_n = __shfl_sync(0xffffffffu, c.claimed, 0);
            if (c.next_n < num_out && lane == 0) c.claimed = atomicAdd(counter, grab);
            c.next_grab_end = min(c.next_n + grab, num_out);
        }
        if (c.next_n < num_out) document_bounds(offsets, pids, c.next_n, c.next_start, c.next_length);
    }

    __device__ __forceinline__ void enter_next(Cursor& c) const {
        c.n = c.next_n;
        c.grab_end = c.next_grab_end;
        c.start = c.next_start;
        c.length = c.next_length;
        c.position = 0;
        c.chunk = c.length > 0 ? 0 : CHUNKS - 1;  // an empty document: one step, no loads
        if (c.n < num_out) find_next(c);
    }

    __device__ __forceinline__ void begin(Cursor& c) const {
        c.claimed = lane == 0 ? atomicAdd(counter, grab) : 0;
        c.n = -1;
        c.grab_end = 0;
        find_next(c);
        enter_next(c);
    }

    __device__ __forceinline__ void advance(Cursor& c) const {
        if (c.n >= num_out) return;
        if (++c.chunk < CHUNKS) return;
        c.chunk = 0;
        c.position += 16;
        if (c.position < c.length) return;
        enter_next(c);  // an empty document has one tile
    }

    __device__ __forceinline__ Step load(const Cursor& c, int g, int q) const {
        Step s;
        s.chunk = c.chunk;
        s.left = c.length - c.position;
        s.out = c.n < num_out ? c.n : -1;
        if (s.out >= 0) {
            const unsigned short* rows = D + c.start * stride_row + c.chunk * 64 + q * 8;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (s.left > 8 * h) {  // the same for the whole warp
                    const int i = min(c.position + 8 * h + g, c.length - 1);
                    load_words(s.w[h], rows + i * stride_row);
                }
            }
        }
        return s;
    }
};

extern "C" __global__ void __launch_bounds__(WARPS * 32, 1)
maxsim_dense_mma(const unsigned short* __restrict__ Q,      // [B, Lq, DIM] ELEM
                 long long stride_qb, long long stride_qt,  // in elements, even
                 int num_query_rows,                        // <= 16 QUERY_BLOCKS
                 const int* __restrict__ query_lengths,     // [B] or null: all rows
                 int row_start,                             // query_lengths count from here
                 const unsigned short* __restrict__ D,      // [T, DIM] rows, ELEM, 16-aligned
                 long long stride_row,                      // in elements, a multiple of 8
                 const long long* __restrict__ offsets,     // [N + 1]
                 const long long* __restrict__ pids,        // [num_out] or null
                 float* __restrict__ out,                   // [B][out_stride]
                 long long out_stride,
                 int* __restrict__ counters,                // [B], zero at launch
                 int num_out, int grab) {
    extern __shared__ uint4 query_fragments[];  // [QUERY_BLOCKS][KBLOCKS][32]
    const int query = blockIdx.y;
    const int query_rows = query_lengths
        ? min(max(query_lengths[query] - row_start, 0), num_query_rows) : num_query_rows;
    const unsigned short* q_rows = Q + query * stride_qb;
    for (int e = threadIdx.x; e < QUERY_BLOCKS * KBLOCKS * 32; e += blockDim.x) {
        const int l = e & 31, kb = (e >> 5) % KBLOCKS, mb = (e >> 5) / KBLOCKS;
        unsigned r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = mb * 16 + (l >> 2) + 8 * (j & 1);
            r[j] = row < query_rows ? *reinterpret_cast<const unsigned*>(
                q_rows + row * stride_qt + dim_of(kb, l & 3, j >> 1)) : 0u;
        }
        query_fragments[e] = make_uint4(r[0], r[1], r[2], r[3]);
    }

    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int q = lane & 3;
    float* out_row = out + query * out_stride;
    bool row_in_query[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; ++j) row_in_query[j] = g + 8 * j < query_rows;
    __syncthreads();

    const Walk walk{offsets, pids, counters + query, D, stride_row, num_out, grab, lane};
    Cursor cursor;
    walk.begin(cursor);
    Step ring[DEPTH];
#pragma unroll
    for (int s = 0; s < DEPTH; ++s) {
        ring[s] = walk.load(cursor, g, q);
        walk.advance(cursor);
    }

    // acc[mb][h]: query block mb against half h's 8 tokens; register 2r + e is row
    // g + 8 (2 mb + r), token 2q + e of the half.
    float acc[QUERY_BLOCKS][2][4];
    float best[ROWS];
#pragma unroll
    for (int mb = 0; mb < QUERY_BLOCKS; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mb][h][i] = 0.f;
#pragma unroll
    for (int j = 0; j < ROWS; ++j) best[j] = NEG_INF;

    for (;;) {
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            const Step step = ring[s];
            if (step.out < 0) return;  // steps come in order: every later one is past the end
            ring[s] = walk.load(cursor, g, q);
            walk.advance(cursor);

            if (step.left > 0) {
                const uint4* a = query_fragments + step.chunk * 4 * 32 + lane;
#pragma unroll
                for (int kbi = 0; kbi < 4; ++kbi)
#pragma unroll
                    for (int mb = 0; mb < QUERY_BLOCKS; ++mb) {
                        const uint4 f = a[(mb * KBLOCKS + kbi) * 32];
                        const unsigned fa[4] = {f.x, f.y, f.z, f.w};
                        mma_16816(acc[mb][0], fa, word(step.w[0], 2 * kbi),
                                  word(step.w[0], 2 * kbi + 1));
                        if (step.left > 8)
                            mma_16816(acc[mb][1], fa, word(step.w[1], 2 * kbi),
                                      word(step.w[1], 2 * kbi + 1));
                    }
            }
            if (step.chunk == CHUNKS - 1) {
                // The tile's products are whole: into the running max, tokens past the end -inf.
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const bool in = 8 * h + 2 * q + e < step.left;
#pragma unroll
                        for (int mb = 0; mb < QUERY_BLOCKS; ++mb)
#pragma unroll
                            for (int r = 0; r < 2; ++r) {
                                const int j = 2 * mb + r;
                                best[j] = max_nan(best[j], in ? acc[mb][h][2 * r + e] : NEG_INF);
                                acc[mb][h][2 * r + e] = 0.f;
                            }
                    }
                if (step.left <= 16) {  // the document's last tile
                    const float total = document_score(best, row_in_query);
                    if (lane == 0) out_row[step.out] = total;
                }
            }
        }
    }
}
