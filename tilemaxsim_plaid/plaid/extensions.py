"""Torch equivalents of colbert-ai's six JIT-compiled C++/CUDA extensions.

colbert-ai compiles these with ``torch.utils.cpp_extension.load`` on first use: ~25 s each on
two cores, and on a GPU host only where an nvcc matching torch's CUDA is installed (ColBERT
#195/#287/#371/#356/#309). Each function below takes the same arguments as the extension it
stands in for and returns the same values in the same dtype, so colbert-ai's own code paths
keep their behaviour ("stock" stays stock). Two deliberate differences, both documented in
patches/README.md: the CUDA decompression allocates on the input's device rather than on
``cuda:0`` (ColBERT#348), and filter_pids sums in torch's order, so float ties may break
differently than in the C++ loop.
"""

from __future__ import annotations

import torch

__all__ = [
    "decompress_residuals_gpu",
    "packbits_gpu",
    "decompress_residuals_cpu",
    "filter_pids_cpu",
    "segmented_lookup",
    "segmented_maxsim",
    "packed_token_rows",
]

# The C++ filter_pids starts every per-token maximum at this value, so a document none of
# whose codes survives pruning scores -9999 * Lq and sorts last.
_FILTER_PIDS_FLOOR = -9999.0


def packed_token_rows(offsets: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Row indices ``offsets[i] .. offsets[i] + lengths[i] - 1`` for each i, concatenated.

    Args:
        offsets: [M] int64 first row of each segment.
        lengths: [M] int64 rows per segment.

    Returns:
        [sum(lengths)] int64 row indices, on ``offsets.device``.
    """
    lengths = lengths.to(torch.int64)
    total = int(lengths.sum())
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths,
                                      output_size=total)
    starts = torch.cumsum(lengths, 0) - lengths  # exclusive prefix sum: output row of each segment
    return offsets.to(torch.int64)[segment] + (torch.arange(total, device=offsets.device) - starts[segment])


def _bucket_indices(binary_residuals, reversed_bit_map, bucket_weight_combinations, dim):
    """[n, dim] int64 bucket index of every dimension (colbert-ai's bit layout, LSB-first fields)."""
    per_byte = reversed_bit_map[binary_residuals.long()]  # [n, packed] bytes with fields reversed
    indices = bucket_weight_combinations[per_byte.long()]  # [n, packed, 8 / nbits]
    return indices.reshape(binary_residuals.shape[0], dim).long()


def decompress_residuals_gpu(binary_residuals, bucket_weights, reversed_bit_map,
                             bucket_weight_combinations, codes, centroids, dim, nbits):
    """Stand-in for ``ResidualCodec.decompress_residuals`` (decompress_residuals.cu).

    ``centroids[code] + bucket_weights[bucket]`` per dimension, unnormalised. The CUDA kernel
    writes the fp16 weight and adds the fp16 centroid with one rounding; torch's fp16 add
    rounds the same way, so the output is bit-identical.

    Args:
        binary_residuals: [n, dim * nbits / 8] uint8.
        bucket_weights: [2**nbits] fp16.
        reversed_bit_map: [256] uint8.
        bucket_weight_combinations: [256, 8 / nbits] uint8.
        codes: [n] int32 centroid ids.
        centroids: [C, dim] fp16.
        dim, nbits: ints.

    Returns:
        [n, dim] in ``centroids.dtype`` on ``binary_residuals.device``.
    """
    del nbits  # implied by the table shapes; kept for the extension's signature
    buckets = _bucket_indices(binary_residuals, reversed_bit_map, bucket_weight_combinations, dim)
    return bucket_weights[buckets].to(centroids.dtype) + centroids[codes.long()]


def packbits_gpu(residuals: torch.Tensor) -> torch.Tensor:
    """Stand-in for ``ResidualCodec.packbits`` (packbits.cu): numpy.packbits, MSB first.

    Args:
        residuals: [n] uint8 of 0/1, n a multiple of 32 (as the CUDA kernel requires).

    Returns:
        [n / 8] uint8; bit 7 of byte j is ``residuals[8 j]``.
    """
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.int32, device=residuals.device)
    bits = (residuals.reshape(-1, 8) != 0).to(torch.int32)
    return (bits * weights).sum(dim=1).to(torch.uint8)


def decompress_residuals_cpu(pids, lengths, offsets, bucket_weights, reversed_bit_map,
                             bucket_weight_combinations, binary_residuals, codes, centroids,
                             dim, nbits):
    """Stand-in for ``IndexScorer.decompress_residuals`` (search/decompress_residuals.cpp).

    Args:
        pids: [M] int32; lengths, offsets: [N] int64 doclens and first rows.
        bucket_weights: [2**nbits] fp32; binary_residuals: [T, dim * nbits / 8] uint8;
        codes: [T] int32; centroids: [C, dim] fp32; the tables as in colbert-ai.

    Returns:
        [sum(lengths[pids]), dim] fp32, unnormalised, documents in ``pids`` order.
    """
    del nbits
    pids = pids.long()
    rows = packed_token_rows(offsets[pids], lengths[pids])
    buckets = _bucket_indices(binary_residuals[rows], reversed_bit_map, bucket_weight_combinations, dim)
    return bucket_weights[buckets] + centroids[codes[rows].long()]


def segmented_lookup(tensor, pids, lengths, offsets):
    """Stand-in for ``StridedTensor.segmented_lookup``: the rows of each pid, concatenated.

    Args:
        tensor: [T] or [T, k] packed rows; pids: [M]; lengths, offsets: [M] int64 (already
            indexed by pid, as StridedTensor passes them).

    Returns:
        [sum(lengths)] or [sum(lengths), k], dtype of ``tensor``.
    """
    del pids
    return tensor[packed_token_rows(offsets, lengths)]


def segmented_maxsim(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Stand-in for ``ColBERT.segmented_maxsim``: per document, sum over query tokens of the
    max over its tokens, with every running max starting at **0** as in the C++ (negative
    maxima are floored to 0; that is upstream behaviour, kept on purpose).

    Args:
        scores: [T, Lq] fp32 token similarities, documents packed in order.
        lengths: [N] int64 tokens per document.

    Returns:
        [N] fp32.
    """
    lengths = lengths.to(torch.int64)
    segment = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    maxima = torch.zeros(lengths.numel(), scores.shape[1], dtype=scores.dtype)
    maxima.scatter_reduce_(0, segment[:, None].expand(-1, scores.shape[1]), scores, "amax",
                           include_self=True)
    return maxima.sum(1)


def _filter_pids_pass(pids, centroid_scores, codes, doclens, offsets, keep, count):
    """One pass of filter_pids.cpp: approximate scores, then the top ``count`` pids ordered by
    (score, pid) descending, as the C++ priority_queue of (float, int) pairs pops them."""
    pids = pids.long()
    if pids.numel() == 0 or count <= 0:
        return pids[:0]
    rows = packed_token_rows(offsets[pids], doclens[pids])
    segment = torch.repeat_interleave(torch.arange(pids.numel()), doclens[pids])
    token_codes = codes[rows].long()
    kept = keep[token_codes]
    nq = centroid_scores.shape[1]
    maxima = torch.full((pids.numel(), nq), _FILTER_PIDS_FLOOR, dtype=torch.float32)
    maxima.scatter_reduce_(0, segment[kept][:, None].expand(-1, nq),
                           centroid_scores[token_codes[kept]], "amax", include_self=True)
    approx = maxima.sum(1)
    by_pid = torch.sort(pids, descending=True, stable=True)
    order = torch.sort(approx[by_pid.indices], descending=True, stable=True).indices
    return by_pid.values[order][:count]


def filter_pids_cpu(pids, centroid_scores, codes, doclens, offsets, idx, nfiltered_docs):
    """Stand-in for ``IndexScorer.filter_pids`` (filter_pids.cpp): PLAID stages 2 and 3.

    Stage 2 keeps the top ``nfiltered_docs`` by centroid interaction over the codes whose
    ``idx`` is True; stage 3 keeps the top ``nfiltered_docs // 4`` of those over all codes.

    Args:
        pids: [M] int32 candidates; centroid_scores: [C, Lq] fp32; codes: [T] int32;
        doclens, offsets: [N] int64; idx: [C] bool; nfiltered_docs: int.

    Returns:
        [<= nfiltered_docs // 4] int32, best first.
    """
    stage2 = _filter_pids_pass(pids, centroid_scores, codes, doclens, offsets, idx, nfiltered_docs)
    everything = torch.ones_like(idx)
    stage3 = _filter_pids_pass(stage2, centroid_scores, codes, doclens, offsets, everything,
                               nfiltered_docs // 4)
    return stage3.to(torch.int32)
