"""Host side of kernels/maxsim_pq_mma.cu: PQ MaxSim on tensor cores, one document stream per warp.

``maxsim_pq(..., config=PQConfig(scoring="mma"))`` runs it, and maxsim_pq takes it by default
where it applies: d = 128 as M = 16 sub-quantizers of 8 dims, fp16 or bf16 queries (longer than
32 tokens: launches of 32, summed), PQ codes of embeddings (no centroid codes or inverse norms),
a GPU of compute capability 8.0 or later; anything else raises ValueError when asked for. The
kernel is CUDA C++ compiled once per device by NVRTC (ops/nvrtc.py). It stages the codebook and
loads the query itself; mma_codebook_lines and mma_query_fragments write the same layouts on the
CPU, where tests/kernels/test_maxsim_pq_mma.py replays the kernel's indexing with them.
"""

import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from tilemaxsim_plaid.ops import mma_fragments, nvrtc
from tilemaxsim_plaid.ops.mma_fragments import DIM, K_BLOCKS, MAX_QUERY_TOKENS

SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "maxsim_pq_mma.cu"
KERNEL_NAME = "maxsim_pq16_mma"
NUM_SUBQUANTIZERS = 16
SUB_DIM = 8
ELEMENT_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}
# A codebook line is 128 bytes of 8 slots (maxsim_pq_mma.cu).
LINE_GROUPS = NUM_SUBQUANTIZERS // 4
BOOK_BYTES = LINE_GROUPS * 256 * 8 * 16
# 16 warps per block, one block per SM: 128 KB of codebook in shared memory serves them all, and
# 128 registers per thread fit (other counts were measured slower:
# results/compressed/h200-pq-mma).
WARPS = 16
DEFAULT_GRAB = 4


def mma_column_order() -> torch.Tensor:
    """[128] int64: column j of the kernel's product order holds dimension order[j].

    Product k-block kb = 2h + s, column c in [0, 16): quad q = (c % 8) // 2 reads sub-quantizer
    4h + q, whose fp16 pair (2s + c // 8) lands on columns 2q + 8 * (c // 8) + (0, 1)."""
    kb = torch.arange(K_BLOCKS)[:, None]
    c = torch.arange(16)[None, :]
    subquantizer = 4 * (kb // 2) + (c % 8) // 2
    element = 4 * (kb % 2) + 2 * (c // 8) + c % 2
    return (subquantizer * SUB_DIM + element).reshape(-1)


def mma_codebook_lines(codebooks: torch.Tensor) -> torch.Tensor:
    """[16, 256, 8] -> [4 * 256 * 8, 8]: the kernel's shared-memory codebook (128 KB in fp16),
    as each block stages it (here on the CPU, for inspection and the tests).

    Line (h, code), 128 bytes, holds entry `code` of sub-quantizers 4h..4h+3 twice: slot 2q + p
    is sub-quantizer 4h + q, copy p. A lane reads copy p = (its token) & 1, so a quarter-warp's
    8 gathers fall in 8 distinct bank groups."""
    grouped = codebooks.reshape(LINE_GROUPS, 4, 256, SUB_DIM).permute(0, 2, 1, 3)
    return grouped[:, :, :, None, :].expand(LINE_GROUPS, 256, 4, 2, SUB_DIM).reshape(-1, SUB_DIM)


def mma_query_fragments(Q3: torch.Tensor, query_lengths: torch.Tensor | None) -> torch.Tensor:
    """[B, Lq <= 32, 128] -> int32 [B, QUERY_REGS, 32]: each lane's A fragments as the kernel
    loads them, columns in mma_column_order (ops/mma_fragments)."""
    return mma_fragments.query_fragments(Q3, query_lengths, mma_column_order())


def reasons_not_to_apply(Q3: torch.Tensor, pq_codes: torch.Tensor, codebooks: torch.Tensor,
                         centroid_codes, inv_norms) -> list[str]:
    """What keeps scoring="mma" from this input (empty: it applies)."""
    reasons = []
    if Q3.dtype not in ELEMENT_NAMES:
        reasons.append(f"Q dtype {Q3.dtype} (fp16 or bf16)")
    if Q3.shape[-1] != DIM or tuple(codebooks.shape) != (NUM_SUBQUANTIZERS, 256, SUB_DIM):
        reasons.append(f"d = {Q3.shape[-1]} with codebooks {tuple(codebooks.shape)} "
                       f"(d = {DIM} as M = {NUM_SUBQUANTIZERS} of {SUB_DIM})")
    if centroid_codes is not None or inv_norms is not None:
        reasons.append("centroid codes or inverse norms (PQ codes of embeddings only)")
    if pq_codes.stride(0) != NUM_SUBQUANTIZERS or pq_codes.data_ptr() % 16:
        reasons.append("code rows that are not 16 contiguous bytes, 16-byte aligned")
    return reasons + mma_fragments.device_reasons(Q3.device)


def check_applies(Q3, pq_codes, codebooks, centroid_codes, inv_norms) -> None:
    """Raises ValueError naming what keeps scoring="mma" from this input."""
    mma_fragments.refuse(reasons_not_to_apply(Q3, pq_codes, codebooks, centroid_codes, inv_norms))


@lru_cache(maxsize=None)
def kernel(device: torch.device, dtype: torch.dtype, book_fp32: bool = False) -> nvrtc.CudaKernel:
    return nvrtc.load_kernel(SOURCE, KERNEL_NAME, device,
                             {"WARPS": WARPS, "ELEM": ELEMENT_NAMES[dtype],
                              "BOOK_F32": int(book_fp32)}, BOOK_BYTES)


def launch_pq_mma(Q3, pq_codes, offsets, codebooks, pids, query_lengths, num_out_docs,
                  grab: int = DEFAULT_GRAB) -> torch.Tensor:
    """fp32 [B, num_out_docs]. Inputs checked by ops/pq.maxsim_pq and check_applies.

    Per call on the host: one memset (the blocks' document counters) and one launch per 32
    query tokens; the kernel stages the codebook (fp32 rounded to Q's dtype on the way) and
    loads its query fragments itself."""
    B = Q3.shape[0]
    device = Q3.device
    out, Q3 = mma_fragments.launch_start(Q3, num_out_docs, grab)
    if out.numel() == 0:
        return out
    book_fp32 = codebooks.dtype == torch.float32
    if not book_fp32:
        codebooks = codebooks.to(Q3.dtype)
    codebooks = codebooks.contiguous()
    lengths = query_lengths.to(torch.int32) if query_lengths is not None else None
    pids64 = pids.to(torch.int64) if pids is not None else None
    launch = kernel(device, Q3.dtype, book_fp32)
    blocks = nvrtc.multiprocessors(device)
    counters = torch.zeros(-(-Q3.shape[1] // MAX_QUERY_TOKENS), B, dtype=torch.int32,
                           device=device)
    # Query tokens in launches of at most 32: the sum over query tokens splits exactly.
    for chunk_index, start in enumerate(range(0, Q3.shape[1], MAX_QUERY_TOKENS)):
        chunk = Q3[:, start:start + MAX_QUERY_TOKENS]
        scores = out if start == 0 else torch.empty_like(out)
        launch((blocks, B, 1), (32 * WARPS, 1, 1),
               [chunk, ctypes.c_longlong(chunk.stride(0)), ctypes.c_longlong(chunk.stride(1)),
                ctypes.c_int(chunk.shape[1]), lengths, ctypes.c_int(start), codebooks,
                pq_codes, offsets, pids64, scores, ctypes.c_longlong(scores.stride(0)),
                counters[chunk_index], ctypes.c_int(num_out_docs), ctypes.c_int(grab)])
        if start:
            out += scores
    return out
