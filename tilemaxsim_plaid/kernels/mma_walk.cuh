// A warp's walk over its documents as one stream of 16-token tiles, for kernels that load a
// tile's data some tiles before they score it (maxsim_residual_mma.cu with PIPELINE_CODES).
//
// The warp takes its outputs in grabs of consecutive ones from a per-query counter, as the
// kernels always have, but the walk does not stop between grabs: the grab after the current
// one is claimed when the current one is entered, and read when the current grab's last
// document is entered (a document ahead), so the tile after a grab's last tile is handed out
// like any other and the loads in flight never drain (with one document a grab the claim is
// read as soon as it is made, a wait a document; the kernels' default grab is two). Each
// document's bounds are read a document ahead.
//
// Plain C++ with its device calls behind ``Warp``, so the tests compile it on the CPU and walk
// simulated warps (tests/kernels/test_mma_walk.py). ``Warp`` provides:
//   int claim()                       the first output of a new grab, as a pending value (lane
//                                     0's atomic; other lanes' values are ignored)
//   int resolve(int pending)          that value in every lane
//   void bounds(int n, long long& start, int& length)   output n's document

#pragma once

#ifdef __CUDACC__
#define WALK_FN __device__ __forceinline__
#else
#define WALK_FN inline
#endif

#define WALK_TILE 16

// One tile handed out: ``n`` the output it belongs to (-1: past the end of the warp's stream,
// nothing to score, though its other fields still name tokens of the index, so loading it
// unconditionally reads only valid memory), ``start`` its document's first token (0 for an
// empty document),
// ``first`` its first token's position in the document, ``last`` the document's last position
// (0 for an empty document; loads read positions up to it only), ``left`` the document's tokens
// from ``first`` on (<= WALK_TILE: the document's last tile; 0: an empty document).
struct TileRef {
    long long start;
    int first, last, left, n;
};

template <typename Warp>
struct Walk {
    Warp& warp;
    int num_out, grab;
    int n;              // the document whose tiles are handed out; -1: none left
    long long start;
    int length, position;
    int grab_end;       // one past the last output of n's grab
    int pending;        // the claim of the grab after n's, until resolved
    int after;          // the document after n; -1: none
    long long after_start;
    int after_length;

    WALK_FN Walk(Warp& w, int num_out_, int grab_) : warp(w), num_out(num_out_), grab(grab_) {
        n = -1;
        start = 0;
        length = position = 0;
        grab_end = 0;
        pending = 0;
        after = warp.resolve(warp.claim());
        if (after >= num_out) after = -1;
        after_start = 0;
        after_length = 0;
        if (after >= 0) warp.bounds(after, after_start, after_length);
        enter_after();
    }

    // ``after`` becomes the document handed out; the one after it is found and its bounds read.
    WALK_FN void enter_after() {
        n = after;
        start = after_start;
        length = after_length;
        position = 0;
        if (n < 0) return;
        if (n >= grab_end) {  // the first document of a new grab: claim the one after it
            grab_end = n + grab < num_out ? n + grab : num_out;
            pending = warp.claim();
        }
        if (n + 1 < grab_end) {
            after = n + 1;
        } else {
            after = warp.resolve(pending);
            if (after >= num_out) after = -1;
        }
        if (after >= 0) warp.bounds(after, after_start, after_length);
    }

    // The next tile of the stream.
    WALK_FN TileRef take() {
        TileRef t;
        t.n = n;
        t.start = length > 0 ? start : 0;
        t.first = position;
        t.last = length > 0 ? length - 1 : 0;
        t.left = length - position;
        if (n < 0) return t;
        position += WALK_TILE;
        if (position >= length) enter_after();
        return t;
    }
};
