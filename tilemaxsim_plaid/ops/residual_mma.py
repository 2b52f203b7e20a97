"""Host side of kernels/maxsim_residual_mma.cu: residual-code MaxSim on tensor cores, one
document stream per warp, each lane decoding exactly the operand it multiplies.

``maxsim_residual(..., config=ResidualConfig(scoring="mma"))`` runs it (and config=None at the
bit widths of ops/residual.MMA_NBITS) where it applies: d = 128, nbits 2 or 4, fp16 or bf16
queries (longer than 32 tokens: launches of 32, summed), inverse norms given (the centroid-score
table path), residual rows of contiguous bytes starting 16-byte aligned, each query's table
within MAX_CENTROID_TABLE_BYTES, a GPU of compute capability 8.0 or later; anything else raises
ValueError when asked for. The kernel is CUDA C++ compiled once per device by NVRTC
(ops/nvrtc.py). The host builds the centroid-score table with its query columns permuted
(:func:`table_column_of_row`) and the byte table (:func:`byte_table`); the kernel loads the
query's fragments itself. :func:`mma_column_order` and :func:`mma_query_fragments` write its
layouts on the CPU, where tests/kernels/test_maxsim_residual_mma.py replays its indexing.
"""

from __future__ import annotations

import ctypes
from functools import cache, lru_cache
from pathlib import Path

import torch

from tilemaxsim_plaid.codecs.residual import bucket_table
from tilemaxsim_plaid.ops import checks, mma_fragments, nvrtc
from tilemaxsim_plaid.ops.mma_fragments import DIM, K_BLOCKS, MAX_QUERY_TOKENS

SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "maxsim_residual_mma.cu"
KERNEL_NAME = "maxsim_residual_mma"
NBITS = (2, 4)
ELEMENT_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}
# Shared memory: 256 byte values x 128 bytes (16 copies of two words at nbits 2, 32 of one at 4).
TABLE_BYTES = 256 * 128
# 16 warps per block, one block per SM (128 registers a thread): more warps hide more of each
# warp's load latency (12 were measured slower: results/PERFORMANCE_LOG.md, run 141).
WARPS = 16
# Documents a warp claims at once: 2 beat 4 and 8 at nbits 2 and 4, C = 2^16 and 2^18
# (results/PERFORMANCE_LOG.md, run 151).
DEFAULT_GRAB = 2
# Cache policies (the kernel's L2_HINTS): the centroid-score table's lines loaded under L2
# evict_last, the residual rows, codes and norms read once under evict_first. Taken for tables of
# at least L2_HINTS_MIN_TABLE_BYTES: faster with a 16 MiB table (C = 2^18), slower with a 4 MiB
# one (results/PERFORMANCE_LOG.md, run 153). L2_HINTS (True / False) overrides the rule.
L2_HINTS_MIN_TABLE_BYTES = 8 << 20
L2_HINTS: bool | None = None


def l2_hints(table_bytes: int) -> bool:
    """Whether a launch over a centroid-score table of ``table_bytes`` takes the L2 policies."""
    return L2_HINTS if L2_HINTS is not None else table_bytes >= L2_HINTS_MIN_TABLE_BYTES


def takes_l2_hints(Q3, centroids, centroid_scores=None, half_table=None) -> bool:
    """l2_hints for this input's centroid-score table (C x B x 32 entries in its dtype)."""
    dtype = _table_dtype(Q3.dtype, centroid_scores, half_table)
    return l2_hints(centroids.shape[0] * Q3.shape[0] * MAX_QUERY_TOKENS * dtype.itemsize)


def mma_column_order() -> torch.Tensor:
    """[128] int64: column j of the kernel's product order holds dimension order[j].

    Product k-block kb, column c in [0, 16): lane quad q = (c % 8) // 2 decodes dimensions
    32q .. 32q + 31, register 2 kb + c // 8 holding dimensions 32q + 4 kb + 2 (c // 8) + (0, 1)."""
    kb = torch.arange(K_BLOCKS)[:, None]
    c = torch.arange(16)[None, :]
    return (32 * ((c % 8) // 2) + 4 * kb + 2 * (c // 8) + c % 2).reshape(-1)


def table_column_of_row(rows: int = MAX_QUERY_TOKENS) -> torch.Tensor:
    """[rows] int64: the centroid-score table column of query row R, 4 (R % 8) + R // 8, so
    lane g's four rows g + 8j (j = 0..3) are four adjacent entries."""
    R = torch.arange(rows)
    return 4 * (R % 8) + R // 8


@cache
def _table_columns(rows: int, device: torch.device) -> torch.Tensor:
    """table_column_of_row(rows) on ``device``, copied there once: a call captured in a CUDA
    graph may not copy from pageable host memory."""
    return table_column_of_row(rows).to(device)


def mma_query_fragments(Q3: torch.Tensor, query_lengths: torch.Tensor | None) -> torch.Tensor:
    """[B, Lq <= 32, 128] -> int32 [B, QUERY_REGS, 32]: each lane's A fragments as the kernel
    loads them, columns in mma_column_order (ops/mma_fragments)."""
    return mma_fragments.query_fragments(Q3, query_lengths, mma_column_order())


def byte_table(bucket_weights: torch.Tensor, nbits: int, dtype: torch.dtype) -> torch.Tensor:
    """int32 [256, 8 // nbits // 2]: for each residual byte value, the weights of its dimensions
    (colbert-ai's bit order: codecs.residual.bucket_table) rounded to ``dtype`` as torch casts,
    two to a word, the first dimension in the low half: the B-fragment registers the kernel
    decodes the byte into."""
    weights = bucket_weights.reshape(-1).to(dtype)
    return weights[_buckets(nbits, weights.device)].contiguous().view(torch.int32)


@cache
def _buckets(nbits: int, device: torch.device) -> torch.Tensor:
    """codecs.residual.bucket_table on ``device``, copied there once (a call being captured in
    a CUDA graph may rebuild the byte table, but cannot copy from the host)."""
    return bucket_table(nbits, device)


def reasons_not_to_apply(Q3, codes, residuals, nbits, inv_norms, centroids, split_query=False,
                         centroid_scores=None) -> list[str]:
    """What keeps scoring="mma" from this input (empty: it applies)."""
    reasons = []
    if Q3.dtype not in ELEMENT_NAMES:
        reasons.append(f"Q dtype {Q3.dtype} (fp16 or bf16)")
    if Q3.shape[-1] != DIM:
        reasons.append(f"d = {Q3.shape[-1]} (d = {DIM})")
    if nbits not in NBITS:
        reasons.append(f"nbits = {nbits} (2 or 4)")
    if inv_norms is None or split_query:
        reasons.append("no inv_norms or split_query (the centroid-table path with 16-bit "
                       "queries only)")
    if codes.numel() == 0:
        reasons.append("an index without tokens")
    if (residuals.dim() != 2 or residuals.stride(-1) != 1
            or residuals.stride(0) != residuals.shape[1] or residuals.data_ptr() % 16):
        reasons.append("residual rows that are not contiguous bytes, 16-byte aligned")
    entry = _table_dtype(Q3.dtype, centroid_scores, None).itemsize
    if centroids.shape[0] * Q3.shape[0] * MAX_QUERY_TOKENS * entry > max_table_bytes():
        reasons.append(f"a centroid-score table of C = {centroids.shape[0]} x B = "
                       f"{Q3.shape[0]} x 32 entries over MAX_CENTROID_TABLE_BYTES")
    return reasons + mma_fragments.device_reasons(Q3.device)


def max_table_bytes() -> int:
    """ops/residual.MAX_CENTROID_TABLE_BYTES as it is now (tests and users may set it)."""
    return _residual_module().MAX_CENTROID_TABLE_BYTES


@cache
def _residual_module():
    from tilemaxsim_plaid.ops import residual  # it imports this module
    return residual


def check_applies(*args, **kwargs) -> None:
    """Raises ValueError naming what keeps scoring="mma" from this input."""
    mma_fragments.refuse(reasons_not_to_apply(*args, **kwargs))


def _table_dtype(query_dtype, centroid_scores, half_table) -> torch.dtype:
    """The table's dtype: a caller's table's; else fp16 for fp16 queries (unless half_table is
    False), fp32 otherwise."""
    if centroid_scores is not None:
        return centroid_scores.dtype
    if query_dtype == torch.float16 and half_table is not False:
        return torch.float16
    return torch.float32


@lru_cache(maxsize=None)
def kernel(device: torch.device, dtype: torch.dtype, nbits: int, table_f32: bool,
           codes_i64: bool, prefetch: bool = True, l2_hints: bool = False) -> nvrtc.CudaKernel:
    return nvrtc.load_kernel(SOURCE, KERNEL_NAME, device,
                             defines(dtype, nbits, table_f32, codes_i64, prefetch, l2_hints),
                             TABLE_BYTES)


def defines(dtype: torch.dtype, nbits: int, table_f32: bool, codes_i64: bool,
            prefetch: bool = True, l2_hints: bool = False) -> dict:
    """The kernel's defines for one launch configuration."""
    return {"WARPS": WARPS, "ELEM": ELEMENT_NAMES[dtype], "NBITS": nbits,
            "TABLE_F32": int(table_f32), "CODES_I64": int(codes_i64),
            "PREFETCH": int(prefetch), "L2_HINTS": int(l2_hints)}


def permuted_table(Q_chunk: torch.Tensor, centroids: torch.Tensor, dtype: torch.dtype,
                   given: torch.Tensor | None = None) -> torch.Tensor:
    """[C, B * 32] in ``dtype``: the centroid-score table of a chunk of <= 32 query rows with its
    columns in table_column_of_row's order (rows past the chunk zero): built here from the chunk
    in one launch (the product reads the rows in that order), or ``given`` ([C, B, chunk rows], a
    caller's table) moved into that order."""
    from tilemaxsim_plaid.ops.residual import query_centroid_scores

    if given is None:
        return query_centroid_scores(Q_chunk, centroids, dtype, permuted=True)
    B, rows, _ = Q_chunk.shape
    C = given.shape[0]
    table = given.new_zeros(C, B, MAX_QUERY_TOKENS)
    table[:, :, _table_columns(rows, Q_chunk.device)] = given
    return table.view(C, B * MAX_QUERY_TOKENS)


def launch_residual_mma(Q3, codes, residuals, offsets, centroids, bucket_weights, nbits, pids,
                        inv_norms, query_lengths, num_out_docs, centroid_scores=None,
                        half_table=None, grab: int = DEFAULT_GRAB,
                        prefetch: bool = True) -> torch.Tensor:
    """fp32 [B, num_out_docs]. Inputs checked by ops/residual.maxsim_residual and check_applies.

    Per call on the host, for each chunk of <= 32 query tokens: the chunk's permuted table (one
    table kernel, or one copy of the caller's), one memset (the warps' document counters) and
    one launch."""
    B, Lq, _ = Q3.shape
    device = Q3.device
    out, Q3 = mma_fragments.launch_start(Q3, num_out_docs, grab)
    if out.numel() == 0:
        return out
    table_dtype = _table_dtype(Q3.dtype, centroid_scores, half_table)
    weights = checks.derived(bucket_weights, ("mma byte table", nbits, Q3.dtype),
                             lambda: byte_table(bucket_weights, nbits, Q3.dtype))
    if inv_norms.dtype != torch.float32:
        inv_norms = checks.derived(inv_norms, "fp32", inv_norms.float)
    lengths = query_lengths.to(torch.int32) if query_lengths is not None else None
    pids64 = pids.to(torch.int64) if pids is not None else None
    hints = takes_l2_hints(Q3, centroids, centroid_scores, half_table)
    launch = kernel(device, Q3.dtype, nbits, table_dtype == torch.float32,
                    codes.dtype == torch.int64, prefetch, hints)
    chunks = -(-Lq // MAX_QUERY_TOKENS)
    counters = torch.zeros(chunks * B, dtype=torch.int32, device=device)
    given = None if centroid_scores is None else centroid_scores.view(-1, B, Lq)
    for chunk_index, start in enumerate(range(0, Lq, MAX_QUERY_TOKENS)):
        # One chunk (Lq <= 32, the usual query) is Q3 and the counters whole: no views.
        chunk = Q3 if chunks == 1 else Q3[:, start:start + MAX_QUERY_TOKENS]
        table = permuted_table(chunk, centroids, table_dtype,
                               None if given is None else given[:, :, start:start + chunk.shape[1]])
        scores = out if start == 0 else torch.empty_like(out)
        launch((nvrtc.multiprocessors(device), B, 1), (32 * WARPS, 1, 1),
               [chunk, ctypes.c_longlong(chunk.stride(0)), ctypes.c_longlong(chunk.stride(1)),
                ctypes.c_int(chunk.shape[1]), lengths, ctypes.c_int(start), weights, residuals,
                codes, inv_norms, table, ctypes.c_uint(table.stride(0) * table.element_size()),
                ctypes.c_int(centroids.shape[0] - 1), offsets, pids64, scores,
                ctypes.c_longlong(scores.stride(0)),
                counters if chunks == 1 else counters[chunk_index * B:(chunk_index + 1) * B],
                ctypes.c_int(num_out_docs), ctypes.c_int(grab)])
        if start:
            out += scores
    return out
