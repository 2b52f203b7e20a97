"""Host side of kernels/maxsim_dense_mma.cu: packed-document MaxSim on tensor cores, one document
stream per warp, each lane loading the operand it multiplies.

``maxsim_packed(..., config=MaxSimConfig(scoring="mma"))`` runs it where it applies: fp16 or
bf16, d a multiple of 64 up to MAX_DIM, document rows of contiguous elements starting 16-byte
aligned, a GPU of compute capability 8.0 or later; anything else raises ValueError naming what
does not apply. Queries of up to 64 tokens take one launch (16-row blocks), longer ones launches
of 64 summed. The kernel is CUDA C++ compiled once per device and shape by NVRTC (ops/nvrtc.py).
:func:`mma_column_order` writes its column order on the CPU, where
tests/kernels/test_maxsim_dense_mma.py replays its indexing.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from tilemaxsim_plaid.ops import mma_fragments, nvrtc

SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "maxsim_dense_mma.cu"
KERNEL_NAME = "maxsim_dense_mma"
ELEMENT_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}
# Query rows per launch: four blocks of 16 as A fragments.
MAX_QUERY_ROWS = 64
# The query's fragments live in shared memory: 16 rows x d x 2 bytes a block, 128 KiB at
# d = 1024 and 64 rows.
MAX_DIM = 1024
# Documents a warp claims at once: 2 and 4 tie, 8 is slower (results/PERFORMANCE_LOG.md,
# run 155).
DEFAULT_GRAB = 4


def pipeline(query_blocks: int) -> tuple[int, int]:
    """(warps of the one block per SM, steps a warp's loads run ahead of its products: 2 KiB a
    step). As many warps as a lane's registers allow without spilling, two steps ahead: 16 up
    to 48 query rows (128 registers), 12 at 64 (170). More warps beat more steps in flight:
    16 x 2 / 12 x 2 were 1.15-1.23x 8 x 4 at 48 / 64 rows (results/PERFORMANCE_LOG.md, run 160;
    registers: results/sass_budget/sm90-nvrtc-aae1a42-dense-mma-pipelines)."""
    return (16, 2) if query_blocks <= 3 else (12, 2)


def mma_column_order(dim: int) -> torch.Tensor:
    """[dim] int64: product column j (k-block j // 16, column j % 16) holds dimension order[j].

    Column k = 2q + 8h + p of k-block kb is word r = 2 (kb % 4) + h of lane quad q's 64-column
    chunk kb // 4, which it loads in two segments of 8 columns: dimension
    64 (kb // 4) + 32 (r // 4) + 8q + 2 (r % 4) + p."""
    kb = torch.arange(dim // 16)[:, None]
    k = torch.arange(16)[None, :]
    q, h, p = (k % 8) // 2, k // 8, k % 2
    r = 2 * (kb % 4) + h
    return (64 * (kb // 4) + 32 * (r // 4) + 8 * q + 2 * (r % 4) + p).reshape(-1)


def reasons_not_to_apply(Q3: torch.Tensor, D: torch.Tensor) -> list[str]:
    """What keeps scoring="mma" from this input (empty: it applies)."""
    reasons = []
    dim = Q3.shape[-1]
    if Q3.dtype not in ELEMENT_NAMES:
        reasons.append(f"dtype {Q3.dtype} (fp16 or bf16)")
    if dim % 64 or dim > MAX_DIM:
        reasons.append(f"d = {dim} (a multiple of 64 up to {MAX_DIM})")
    if D.shape[0] == 0:
        reasons.append("D_packed without rows")
    elif (D.stride(1) != 1 or (D.stride(0) * D.element_size()) % 16 or D.data_ptr() % 16):
        reasons.append("document rows that are not contiguous elements starting 16-byte aligned")
    return reasons + mma_fragments.device_reasons(Q3.device)


def check_applies(Q3: torch.Tensor, D: torch.Tensor) -> None:
    """Raises ValueError naming what keeps scoring="mma" from this input."""
    mma_fragments.refuse(reasons_not_to_apply(Q3, D))


@lru_cache(maxsize=None)
def kernel(device: torch.device, dtype: torch.dtype, dim: int, query_blocks: int, warps: int,
           depth: int) -> nvrtc.CudaKernel:
    return nvrtc.load_kernel(SOURCE, KERNEL_NAME, device,
                             {"WARPS": warps, "ELEM": ELEMENT_NAMES[dtype], "DIM": dim,
                              "QUERY_BLOCKS": query_blocks, "DEPTH": depth},
                             shared_bytes(dim, query_blocks))


def shared_bytes(dim: int, query_blocks: int) -> int:
    """The query's A fragments: 16-byte words for every (block, k-block, lane)."""
    return query_blocks * (dim // 16) * 32 * 16


def launch_dense_mma(Q3: torch.Tensor, D: torch.Tensor, offsets: torch.Tensor,
                     pids: torch.Tensor | None, query_lengths: torch.Tensor | None,
                     num_out_docs: int, grab: int = DEFAULT_GRAB) -> torch.Tensor:
    """fp32 [B, num_out_docs]. Inputs checked by ops/dense.maxsim_packed and check_applies.

    Per call on the host, for each chunk of <= 64 query tokens: one memset (the warps'
    document counters) and one launch."""
    B, Lq, dim = Q3.shape
    device = Q3.device
    out, Q3 = mma_fragments.launch_start(Q3, num_out_docs, grab)
    if out.numel() == 0:
        return out
    lengths = query_lengths.to(torch.int32) if query_lengths is not None else None
    pids64 = pids.to(torch.int64) if pids is not None else None
    chunks = -(-Lq // MAX_QUERY_ROWS)
    counters = torch.zeros(chunks, B, dtype=torch.int32, device=device)
    for chunk_index, start in enumerate(range(0, Lq, MAX_QUERY_ROWS)):
        chunk = Q3[:, start:start + MAX_QUERY_ROWS]
        query_blocks = -(-chunk.shape[1] // 16)
        warps, depth = pipeline(query_blocks)
        launch = kernel(device, Q3.dtype, dim, query_blocks, warps, depth)
        scores = out if start == 0 else torch.empty_like(out)
        launch((nvrtc.multiprocessors(device), B, 1), (32 * warps, 1, 1),
               [chunk, ctypes.c_longlong(chunk.stride(0)), ctypes.c_longlong(chunk.stride(1)),
                ctypes.c_int(chunk.shape[1]), lengths, ctypes.c_int(start), D,
                ctypes.c_longlong(D.stride(0)), offsets, pids64, scores,
                ctypes.c_longlong(scores.stride(0)), counters[chunk_index],
                ctypes.c_int(num_out_docs), ctypes.c_int(grab)])
        if start:
            out += scores
    return out
