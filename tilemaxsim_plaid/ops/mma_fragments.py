"""The query as the CUDA MaxSim kernels hold it (kernels/maxsim_pq_mma.cu,
kernels/maxsim_residual_mma.cu): the A operand of mma.sync.m16n8k16, 32 query rows of 128 product
columns in 64 registers per lane, written here on the CPU for inspection and the tests; what
the mma kernels' host functions do first (:func:`launch_start`), and how they say what does not
apply (:func:`device_reasons`, :func:`refuse`)."""

from __future__ import annotations

import torch

from tilemaxsim_plaid.ops import nvrtc

DIM = 128
MAX_QUERY_TOKENS = 32
# 8 k-blocks of 16 columns x 2 blocks of 16 query rows x 4 registers per A fragment.
K_BLOCKS = DIM // 16
QUERY_REGS = K_BLOCKS * 2 * 4


def fragment_index() -> tuple[torch.Tensor, torch.Tensor]:
    """Query row and product column of each of the 2 halves of register i of lane l:
    [QUERY_REGS, 32, 2] each. Register i = (kb * 2 + qb) * 4 + r of an m16n8k16 A fragment:
    rows qb * 16 + g + 8 (r % 2), columns kb * 16 + 2q + 8 (r // 2) + (0, 1), g = l // 4,
    q = l % 4."""
    i = torch.arange(QUERY_REGS)[:, None, None]
    lane = torch.arange(32)[None, :, None]
    half = torch.arange(2)[None, None, :]
    kb, qb, r = i // 8, (i // 4) % 2, i % 4
    rows = qb * 16 + lane // 4 + 8 * (r % 2)
    cols = kb * 16 + 2 * (lane % 4) + 8 * (r // 2) + half
    return rows.expand(-1, 32, 2), cols.expand(-1, -1, 2)


def query_fragments(Q3: torch.Tensor, query_lengths: torch.Tensor | None,
                    column_order: torch.Tensor) -> torch.Tensor:
    """[B, Lq <= 32, 128] fp16/bf16 -> int32 [B, QUERY_REGS, 32]: each lane's A fragments, the
    product columns taken in ``column_order`` (product column j is dimension column_order[j]);
    rows past a query's length (and past Lq) are zero."""
    B, Lq, _ = Q3.shape
    padded = torch.zeros(B, MAX_QUERY_TOKENS, DIM, dtype=Q3.dtype, device=Q3.device)
    padded[:, :Lq] = Q3[:, :, column_order.to(Q3.device)]
    if query_lengths is not None:
        keep = torch.arange(MAX_QUERY_TOKENS, device=Q3.device)[None] < query_lengths[:, None]
        padded *= keep[:, :, None].to(Q3.dtype)
    rows, cols = (index.to(Q3.device) for index in fragment_index())
    return padded[:, rows, cols].contiguous().view(torch.int32).reshape(B, QUERY_REGS, 32)


def query_from_fragments(fragments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse, in float64: [B, QUERY_REGS, 32] int32 -> [B, 32, 128] in product-column
    order, as the tests' replays of the kernels read the query."""
    B = fragments.shape[0]
    pairs = fragments.contiguous().view(dtype).reshape(B, QUERY_REGS, 32, 2)
    rows, cols = fragment_index()
    query = torch.zeros(B, MAX_QUERY_TOKENS, DIM, dtype=torch.float64)
    query[:, rows, cols] = pairs.double()
    return query


def launch_start(Q3: torch.Tensor, num_out_docs: int,
                 grab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, Q3 as the kernels load it): fp32 [B, num_out_docs] scores to fill, and Q3 with rows
    of contiguous, 4-byte aligned pairs (each lane loads its fragments as 4-byte words; a copy
    where they are not). Raises ValueError for fewer than one document per grab."""
    if grab < 1:
        raise ValueError(f"config.docs_per_program (documents per grab) must be >= 1, got {grab}")
    out = torch.empty(Q3.shape[0], num_out_docs, dtype=torch.float32, device=Q3.device)
    if Q3.stride(2) != 1 or Q3.stride(0) % 2 or Q3.stride(1) % 2 or Q3.data_ptr() % 4:
        Q3 = Q3.contiguous()
    return out, Q3


def device_reasons(device: torch.device) -> list[str]:
    """What keeps an mma.sync kernel from ``device`` (empty: a GPU of compute capability 8.0 or
    later)."""
    if device.type != "cuda":
        return [f"device {device} (a CUDA GPU)"]
    if nvrtc.capability(device) < (8, 0):
        return ["a GPU before compute capability 8.0"]
    return []


def refuse(reasons: list[str]) -> None:
    """Raises ValueError naming ``reasons``, what keeps config.scoring="mma" from an input."""
    if reasons:
        raise ValueError("config.scoring='mma' does not cover: " + "; ".join(reasons))
