"""Host side of kernels/maxsim_pq_lut_shared.cu: PQ lookup tables held in shared memory.

``maxsim_pq(..., config=PQConfig(scoring="lut"))`` builds the per-query tables once per call
(ops/pq._launch_lut) and, on a GPU with NVRTC where a tile's table fits in a block's shared
memory, scores with this CUDA kernel; elsewhere (the CPU, or a table too large) with the Triton
kernel that reads the same tables through L1 (kernels/maxsim_pq_lut.py).
``PQConfig.lut_shared`` chooses explicitly.
"""

import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from tilemaxsim_plaid.ops import nvrtc

SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "maxsim_pq_lut_shared.cu"
KERNEL_NAME = "maxsim_pq_lut_shared"
WARPS = 16
DEFAULT_GRAB = 4
# sm_80 and later let a block opt in to this much shared memory at most (an H100/H200 has 227 KB).
MIN_OPTIN_SHARED = 163 * 1024


def table_bytes(num_subquantizers: int, rows: int) -> int:
    """Shared memory of one tile's table: M * 256 entries of ``rows`` fp32."""
    return num_subquantizers * 256 * rows * 4


@lru_cache(maxsize=None)
def shared_limit(device: torch.device) -> int:
    properties = torch.cuda.get_device_properties(device)
    return getattr(properties, "shared_memory_per_block_optin", MIN_OPTIN_SHARED)


def reasons_not_to_apply(Q3: torch.Tensor, num_subquantizers: int, rows: int) -> list[str]:
    """What keeps the shared-memory table kernel from this input (empty: it applies)."""
    reasons = []
    if Q3.device.type != "cuda":
        reasons.append(f"device {Q3.device} (a CUDA GPU)")
    elif table_bytes(num_subquantizers, rows) > shared_limit(Q3.device):
        reasons.append(f"a table tile of {table_bytes(num_subquantizers, rows) // 1024} KB "
                       f"(M = {num_subquantizers}, lut_rows = {rows}) larger than the "
                       f"{shared_limit(Q3.device) // 1024} KB a block's shared memory holds: "
                       f"lower lut_rows")
    elif not nvrtc.available():
        reasons.append("NVRTC (it comes with PyTorch's CUDA builds)")
    return reasons


@lru_cache(maxsize=None)
def kernel(device: torch.device, rows: int, code_words: bool, shared_bytes: int):
    return nvrtc.load_kernel(SOURCE, KERNEL_NAME, device,
                             {"ROWS": rows, "WARPS": WARPS, "CODE_WORDS": int(code_words)},
                             shared_bytes)


def launch(lut, pq_codes, offsets, pids, centroid_codes, scores_table, inv_norms, row_query,
           row_valid, partial, rows: int, grab: int = DEFAULT_GRAB) -> None:
    """Writes partial [tiles, N'] (tiles = lut.shape[0]) from tables built by ops/pq._launch_lut."""
    tiles, entries, _ = lut.shape
    num_subquantizers = entries // 256
    num_out = partial.shape[1]
    if num_out == 0 or tiles == 0:
        return
    device = lut.device
    code_words = (num_subquantizers % 4 == 0 and pq_codes.stride(0) % 4 == 0
                  and pq_codes.data_ptr() % 4 == 0)
    shared_bytes = table_bytes(num_subquantizers, rows)
    counters = torch.zeros(tiles, dtype=torch.int32, device=device)
    use_table = centroid_codes is not None
    blocks = torch.cuda.get_device_properties(device).multi_processor_count
    kernel(device, rows, code_words, shared_bytes)(
        (blocks, tiles, 1), (32 * WARPS, 1, 1),
        [lut, pq_codes, ctypes.c_longlong(pq_codes.stride(0)), ctypes.c_int(num_subquantizers),
         offsets, pids.to(torch.int64) if pids is not None else None,
         centroid_codes.to(torch.int32) if use_table else None,
         scores_table.float() if use_table else None,
         ctypes.c_longlong(scores_table.stride(0) if use_table else 0),
         inv_norms.float() if inv_norms is not None else None,
         row_query, row_valid, partial, ctypes.c_longlong(partial.stride(0)), counters,
         ctypes.c_int(num_out), ctypes.c_int(grab)])
