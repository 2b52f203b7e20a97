"""Small @triton.jit pieces shared by the MaxSim kernels."""

import triton
import triton.language as tl

from tilemaxsim_plaid.triton_support import interpreting


@triton.jit
def tile_dot(a, b_t, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """[M, K] @ [N, K]^T -> [M, N] in fp32.

    UPCAST multiplies in fp32: only the CPU interpreter needs it, because it multiplies bf16 bit
    patterns as integers (triton 3.9); on a GPU the tensor cores take fp16/bf16 directly.
    """
    if UPCAST:
        a = a.to(tl.float32)
        b_t = b_t.to(tl.float32)
    return tl.dot(a, tl.trans(b_t), input_precision=INPUT_PRECISION)


@triton.jit
def maximum_nan(a, b):
    """Elementwise max that propagates NaN, as torch's max does (the NaN policy, docs/kernels.md):
    tl.maximum's default (IEEE maxNum, PTX max.f32) drops a NaN operand and returns the other.
    PTX max.NaN.f32 (sm_80 on), the same throughput as max.f32. -inf never beats a NaN."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_nan_tree(x, axis: tl.constexpr):
    """tl.max(x, axis) that propagates NaN: tl.max takes no propagate_nan (triton 3.6 to 3.9) and
    reduces by maxNum; this is tl.max's own reduction with maximum_nan as its combine."""
    return tl.reduce(x, axis, maximum_nan)


@triton.jit
def max_nan_flagged(x, axis: tl.constexpr):
    """max_nan_tree's values from the interpreter's vectorised reductions: its tl.max (numpy's
    nanmax, NaN dropped) and a per-slice NaN flag. The interpreter runs a reduction with a jitted
    combine one element at a time, which would make the CPU tests many times slower."""
    has_nan = tl.max((x != x).to(tl.int32), axis=axis)
    largest = tl.max(tl.where(x != x, float("-inf"), x), axis=axis)
    return tl.where(has_nan != 0, float("nan"), largest)


# The kernels' NaN-propagating reduction: the reduction tree compiled (GPU), the flagged form
# under TRITON_INTERPRET (the CPU); tests/kernels/test_nan_policy.py holds both to torch.amax.
max_nan = max_nan_flagged if interpreting() else max_nan_tree


@triton.jit
def packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS: tl.constexpr):
    """(valid, start, end) token rows of the ``out_idx``-th scored document of a packed corpus:
    document ``pids[out_idx]`` (or ``out_idx``) owns rows ``offsets[doc]:offsets[doc + 1]``.

    Branch-free on purpose: a slot past the end (``valid`` False) is an empty document whose
    score is never stored, which keeps the caller's document loop software-pipelinable. An end
    before its start (offsets out of order, clamped into the rows and judged after the launch)
    is an empty document too, so every row read lies between two offsets.
    """
    valid = out_idx < num_out_docs
    if HAS_PIDS:
        doc = tl.load(p_pids + out_idx, mask=valid, other=0).to(tl.int64)
    else:
        doc = out_idx
    start = tl.load(p_offsets + doc, mask=valid, other=0)
    end = tl.load(p_offsets + doc + 1, mask=valid, other=0)
    return valid, start, tl.where(valid, tl.maximum(end, start), start)


@triton.jit
def unpack_16bit_word_pair(low, high, dot_dtype: tl.constexpr):
    """Two int32 words (low first) of four packed 16-bit weights -> [..., 2, 2] in dot_dtype,
    as unpack_16bit_weights of the int64 they form. 32-bit halves, not an int64 split by 64-bit
    shifts: each word is then already a tensor-core fp16 pair, and the compiler moves no bits."""
    w0 = low.to(tl.int16).to(dot_dtype, bitcast=True)
    w1 = (low >> 16).to(tl.int16).to(dot_dtype, bitcast=True)
    w2 = high.to(tl.int16).to(dot_dtype, bitcast=True)
    w3 = (high >> 16).to(tl.int16).to(dot_dtype, bitcast=True)
    return tl.join(tl.join(w0, w2), tl.join(w1, w3))


@triton.jit
def unpack_16bit_weights(words, dot_dtype: tl.constexpr, PER_WORD: tl.constexpr):
    """[..., n] int32 (PER_WORD = 2) or int64 (PER_WORD = 4) words of packed 16-bit weights ->
    [..., 2] or [..., 2, 2] in dot_dtype, in the order that flattens to the weights' own (first
    weight in the lowest bits). The split is shifts and bitcasts, no arithmetic."""
    if PER_WORD == 4:
        weights = unpack_16bit_word_pair(words.to(tl.int32), (words >> 32).to(tl.int32),
                                         dot_dtype)
    else:
        weights = tl.join(words.to(tl.int16).to(dot_dtype, bitcast=True),
                          (words >> 16).to(tl.int16).to(dot_dtype, bitcast=True))
    return weights


# L2 lines are 128 B; a prefetch asks for one line per element.
LINE_BYTES = tl.constexpr(128)


@triton.jit
def prefetch_rows_l2(p_rows, first, last, row_bytes, LINES: tl.constexpr):
    """Asks L2 for rows first .. last of a row-major array (row_bytes bytes each), up to LINES
    128-B lines, one per element, by inline PTX (GPU only: the interpreter runs no PTX).

    A prefetch holds no register and blocks nothing: the rows' HBM latency then overlaps the work
    before their loads, which find them in L2. Returns a dummy 0 tensor the caller may ignore.
    """
    p_bytes = p_rows.to(tl.pointer_type(tl.int8))
    offs = first.to(tl.int64) * row_bytes + tl.arange(0, LINES) * LINE_BYTES
    wanted = offs < last.to(tl.int64) * row_bytes
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [p_bytes + offs, wanted.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
