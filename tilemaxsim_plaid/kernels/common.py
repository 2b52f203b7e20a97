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
