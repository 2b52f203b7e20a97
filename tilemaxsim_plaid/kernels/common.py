"""Small @triton.jit pieces shared by the MaxSim kernels."""

import triton
import triton.language as tl


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
def packed_doc_bounds(p_pids, p_offsets, out_idx, num_out_docs, HAS_PIDS: tl.constexpr):
    """(valid, start, end) token rows of the ``out_idx``-th scored document of a packed corpus:
    document ``pids[out_idx]`` (or ``out_idx``) owns rows ``offsets[doc]:offsets[doc + 1]``.

    Branch-free on purpose: a slot past the end (``valid`` False) is an empty document whose
    score is never stored, which keeps the caller's document loop software-pipelinable.
    """
    valid = out_idx < num_out_docs
    if HAS_PIDS:
        doc = tl.load(p_pids + out_idx, mask=valid, other=0).to(tl.int64)
    else:
        doc = out_idx
    start = tl.load(p_offsets + doc, mask=valid, other=0)
    end = tl.load(p_offsets + doc + 1, mask=valid, other=0)
    return valid, start, tl.where(valid, end, start)
