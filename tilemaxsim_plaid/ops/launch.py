"""Launch parameters that depend on the dtype and on where the kernels run."""

import os

import torch


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs are multiplied in full fp32: tf32 would drop ~3 significant digits and exactness
    # is the point of this scorer. fp16/bf16 products are exact in fp32 either way.
    return "ieee" if dtype == torch.float32 else "tf32"


def interpreter_upcast(dtype: torch.dtype) -> bool:
    """True when tile_dot must multiply in fp32 (bf16 under TRITON_INTERPRET=1, see tile_dot)."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
