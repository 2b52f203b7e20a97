"""What each part of residual-code scoring costs: per-document floors of maxsim_residual.

``maxsim_residual`` (one query, centroid-score table, precomputed inverse norms, pair decoder)
does four things per token of a document: it reads the token's code, residual words and inverse
norm; gathers the code's row of the centroid-score table S; decodes the residual bits to fp16
weights; and multiplies them with the query (then scales, maxes and sums). Each stage below is
one program per document in the same layout and does the first 1, 2 or 3 of those things, and
folds what it computed into one number per document so that nothing is optimised away:

* ``read``: sums the low byte of every code and residual word, and the inverse norms.
* ``gather``: also keeps the running max of each query row's S entry, as the kernel's score
  starts from (the centroid part of the score).
* ``decode``: also decodes every residual word with the kernel's own decoder and sums the weights.

The full kernel's time minus the last floor is what the products and the rest cost.
``tilemaxsim bench-compressed`` reports the floors beside the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilemaxsim_plaid.codecs.residual import decompress_residuals
from tilemaxsim_plaid.kernels.maxsim_residual import decode_pair_words_fp16
from tilemaxsim_plaid.ops.residual import decode_table

STAGES = ("read", "gather", "decode")
# Launch configurations timed per stage (tokens per tile, warps); the bench reports the fastest.
CONFIGS = [(32, 2), (32, 4), (64, 4)]


@triton.jit
def _residual_floor_kernel(p_codes, p_words, p_inv_norms, p_offsets, p_scores, p_table, p_out,
                           words_per_row, num_cols, stride_sc,
                           NBITS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_Q: tl.constexpr, STAGE: tl.constexpr, PTX_LOADS: tl.constexpr):
    doc = tl.program_id(0)
    start = tl.load(p_offsets + doc)
    end = tl.load(p_offsets + doc + 1)
    WORDS: tl.constexpr = BLOCK_D * NBITS // 32
    offs_w = tl.arange(0, WORDS)
    offs_c = tl.arange(0, BLOCK_Q)
    mask_c = offs_c < num_cols
    low_bytes = tl.zeros([BLOCK_T], tl.float32)
    norms = tl.zeros([BLOCK_T], tl.float32)
    weights = tl.zeros([BLOCK_T], tl.float32)
    best = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < end
        codes = tl.load(p_codes + offs_t, mask=mask_t, other=0)
        words = tl.load(p_words + offs_t.to(tl.int64)[:, None] * words_per_row + offs_w[None, :],
                        mask=mask_t[:, None] & (offs_w < words_per_row)[None, :], other=0)
        inv_norm = tl.load(p_inv_norms + offs_t, mask=mask_t, other=0.0)
        low_bytes += (codes & 0xFF).to(tl.float32) + tl.sum((words & 0xFF).to(tl.float32), axis=1)
        norms += inv_norm.to(tl.float32)
        if STAGE >= 1:
            s_rows = tl.load(p_scores + codes.to(tl.int64)[:, None] * stride_sc + offs_c[None, :],
                             mask=mask_t[:, None] & mask_c[None, :], other=float("-inf"))
            best = tl.maximum(best, tl.max(s_rows, axis=0))
        if STAGE >= 2:
            # The pair decoder (2 dimensions per lookup), 32-bit words, fp16 weights.
            decoded = decode_pair_words_fp16(words, p_table, NBITS, BLOCK_T, BLOCK_D, PTX_LOADS)
            # Rows past the document decode the zero word to real weights: leave them out.
            weights += tl.sum(tl.where(mask_t[:, None], decoded.to(tl.float32), 0.0), axis=1)
    total = tl.sum(low_bytes, axis=0) + tl.sum(norms, axis=0) + tl.sum(weights, axis=0)
    if STAGE >= 1:
        # An empty document has no maxima: it adds 0, not -inf.
        total += tl.sum(tl.where(mask_c & (best > float("-inf")), best, 0.0), axis=0)
    tl.store(p_out + doc, total)


def _check(codes, residuals, inv_norms, offsets, scores, nbits):
    dim = residuals.shape[1] * 8 // nbits
    if dim > 128 or dim & (dim - 1) or residuals.shape[1] % 4:
        raise ValueError(f"the floors take d a power of two <= 128 with whole-word rows; got d = {dim}")
    if not residuals.is_contiguous() or residuals.dtype != torch.uint8:
        raise ValueError(f"residuals must be contiguous uint8 [T, d*nbits/8], got {residuals.dtype}")
    if offsets.dtype != torch.int64 or codes.shape[0] != residuals.shape[0] != inv_norms.shape[0]:
        raise ValueError("offsets must be int64 and codes, residuals and inv_norms one row per token")
    if scores.dim() != 2 or scores.stride(1) != 1:
        raise ValueError(f"scores must be a row-major [C, columns] table, got {tuple(scores.shape)}")
    return dim


def residual_floor(stage: str, codes, residuals, inv_norms, offsets, scores, bucket_weights,
                   nbits: int, block_t: int = 32, num_warps: int = 2) -> torch.Tensor:
    """fp32 [N]: one program per document doing the reading (and gathering, and decoding) of
    ``stage``; see the module docstring for what each folds into its number."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    dim = _check(codes, residuals, inv_norms, offsets, scores, nbits)
    num_docs = offsets.numel() - 1
    out = torch.empty(num_docs, device=codes.device, dtype=torch.float32)
    if num_docs == 0:
        return out
    table = decode_table(bucket_weights, nbits, torch.float16, group=2)
    words = residuals.view(torch.int32)
    _residual_floor_kernel[(num_docs,)](
        codes, words, inv_norms, offsets, scores, table, out,
        words.shape[1], scores.shape[1], scores.stride(0),
        NBITS=nbits, BLOCK_T=block_t, BLOCK_D=dim, BLOCK_Q=triton.next_power_of_2(scores.shape[1]),
        # tl.load for the pair table: inline PTX pays where the decoded tile feeds the tensor
        # cores (the kernel), but in this floor's reduction layout it took 1.17 ms against
        # 0.445 with tl.load (H200, results/compressed/h200-ptx-loads).
        STAGE=STAGES.index(stage), PTX_LOADS=False, num_warps=num_warps, num_stages=1)
    return out


def expected_floor(stage: str, codes, residuals, inv_norms, offsets, scores, bucket_weights,
                   nbits: int) -> torch.Tensor:
    """What :func:`residual_floor` computes, in float64 torch."""
    num_docs = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    num_tokens = int(offsets[-1])  # rows past the last document are not read
    codes, residuals, inv_norms = codes[:num_tokens], residuals[:num_tokens], inv_norms[:num_tokens]
    doc_of_token = torch.repeat_interleave(torch.arange(num_docs, device=codes.device), lengths)

    def per_doc(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_docs, dtype=torch.float64, device=codes.device).index_add_(
            0, doc_of_token, values.double())

    words = residuals.view(torch.int32)
    total = per_doc((codes.long() & 0xFF) + (words.long() & 0xFF).sum(1)) + per_doc(inv_norms)
    if stage in ("gather", "decode"):
        rows = scores[codes.long()].double()
        best = torch.full((num_docs, scores.shape[1]), float("-inf"), dtype=torch.float64,
                          device=codes.device)
        best.scatter_reduce_(0, doc_of_token[:, None].expand_as(rows), rows, reduce="amax")
        total += torch.where(lengths[:, None] > 0, best, torch.zeros_like(best)).sum(1)
    if stage == "decode":
        dim = residuals.shape[1] * 8 // nbits
        zero_centroids = torch.zeros(1, dim, dtype=torch.float16, device=codes.device)
        decoded = decompress_residuals(torch.zeros_like(codes), residuals, zero_centroids,
                                       bucket_weights.half(), nbits, normalize=False)
        total += per_doc(decoded.double().sum(1))
    return total
