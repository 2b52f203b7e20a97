"""The read ceiling of per-document programs over PLAID's packed layout.

``x.sum()`` over the whole packed tensor is the read ceiling of a contiguous stream. A MaxSim
kernel that gives each document its own program (ours, flash-maxsim's and late-interaction-
kernels' packed kernels) reads the same bytes in short runs: a dependent load of the document's
offsets, then one or two row tiles for a 70-token document, the last one partly masked. This
kernel does exactly that reading and nothing else (it sums each document's elements), so its
bandwidth is the most any per-document MaxSim kernel can reach on a given length distribution.
``tilemaxsim bench`` reports it beside the packed shapes as the ``read_per_document`` row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The launch configurations timed for the ceiling; the bench reports the fastest.
CONFIGS = [(block_t, warps, stages) for block_t in (32, 64, 128) for warps in (2, 4) for stages in (2, 3)]


@triton.jit
def _per_document_read_kernel(p_d, p_offsets, p_q, p_out, dim, stride_t,
                              BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                              QUERY_ROWS: tl.constexpr, PRODUCT: tl.constexpr):
    doc = tl.program_id(0)
    start = tl.load(p_offsets + doc)
    end = tl.load(p_offsets + doc + 1)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < dim
    if QUERY_ROWS > 0:
        offs_q = tl.arange(0, QUERY_ROWS)
        q = tl.load(p_q + offs_q[:, None] * dim + offs_d[None, :], mask=mask_d[None, :], other=0.0)
    if PRODUCT:
        best = tl.full([QUERY_ROWS], float("-inf"), tl.float32)
    else:
        acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < end
        tile = tl.load(p_d + offs_t.to(tl.int64)[:, None] * stride_t + offs_d[None, :],
                       mask=mask_t[:, None] & mask_d[None, :], other=0.0)
        if PRODUCT:
            scores = tl.dot(tile, tl.trans(q))  # [BLOCK_T, QUERY_ROWS], fp32
            scores = tl.where(mask_t[:, None], scores, float("-inf"))
            best = tl.maximum(best, tl.max(scores, axis=0))
        else:
            acc += tile.to(tl.float32)
    if PRODUCT:
        tl.store(p_out + doc, tl.sum(best, axis=0))
    else:
        total = tl.sum(tl.sum(acc, axis=1), axis=0)
        if QUERY_ROWS > 0:
            total += tl.sum(tl.sum(q.to(tl.float32), axis=1), axis=0)
        tl.store(p_out + doc, total)


def per_document_read(D_packed: torch.Tensor, offsets: torch.Tensor, block_t: int = 32,
                      num_warps: int = 2, num_stages: int = 2, query: torch.Tensor | None = None,
                      product: bool = False) -> torch.Tensor:
    """fp32 [N], one program per document: the sum of each document's elements (plus the sum of
    ``query`` [Lq, d], loaded once per program, when given); with ``product``, a bare MaxSim
    against ``query`` (no query lengths, one d tile; documents must not be empty). The two
    variants say what loading the query per program, and the products, cost on top of reading."""
    if D_packed.dim() != 2 or D_packed.stride(1) != 1:
        raise ValueError(f"D_packed must be a row-major [T, d] tensor, got shape {tuple(D_packed.shape)}")
    if offsets.dim() != 1 or offsets.dtype != torch.int64:
        raise ValueError(f"offsets must be int64 [N+1], got {offsets.dtype} {tuple(offsets.shape)}")
    if product and query is None:
        raise ValueError("product=True needs a query")
    if query is not None and (query.dim() != 2 or query.shape[1] != D_packed.shape[1]
                              or query.shape[0] & (query.shape[0] - 1) or not query.is_contiguous()):
        raise ValueError(f"query must be a contiguous [Lq, d] tensor with Lq a power of two and "
                         f"d = {D_packed.shape[1]}, got shape {tuple(query.shape)}")
    num_docs = offsets.numel() - 1
    out = torch.empty(num_docs, device=D_packed.device, dtype=torch.float32)
    if num_docs == 0:
        return out
    dim = D_packed.shape[1]
    _per_document_read_kernel[(num_docs,)](
        D_packed, offsets, D_packed if query is None else query, out, dim, D_packed.stride(0),
        BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(dim),
        QUERY_ROWS=0 if query is None else query.shape[0], PRODUCT=product,
        num_warps=num_warps, num_stages=num_stages)
    return out


def expected_read(D_packed: torch.Tensor, offsets: torch.Tensor,
                  query: torch.Tensor | None = None) -> torch.Tensor:
    """What :func:`per_document_read` computes without ``product``, in fp32 torch."""
    num_docs = offsets.numel() - 1
    doc_ids = torch.repeat_interleave(torch.arange(num_docs, device=offsets.device),
                                      offsets[1:] - offsets[:-1])
    rows = D_packed[: int(offsets[-1])].float().sum(1)
    out = torch.zeros(num_docs, device=offsets.device).index_add_(0, doc_ids, rows)
    if query is not None:
        out += query.float().sum()
    return out
