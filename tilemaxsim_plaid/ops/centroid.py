"""Host side of PLAID's centroid interaction (stages 2-3): check, allocate, launch."""

from __future__ import annotations

import torch

from tilemaxsim_plaid.kernels.maxsim_centroid import _centroid_interaction_kernel, _probe_centroids_kernel
from tilemaxsim_plaid.ops import checks
# Query columns per launch; longer queries (full_length_search) are split and summed, which
# is exact because the score is a sum over query tokens.
from tilemaxsim_plaid.ops.launch import MAX_LQ_PER_LAUNCH, cdiv, persistent_programs, pow2

__all__ = ["centroid_interaction", "probe_centroids", "cells_from_blocks", "MAX_PROBE_COLUMNS"]

# Tokens per step: a [64, 32] fp32 tile of gathered centroid scores is 8 KB of registers
# across 4 warps, and 64 covers most passages (PLAID doclens ~ 30-180) in one or two steps.
BLOCK_T = 64
NUM_WARPS = 4
# Unused slots written as -inf per step of a num_used launch (one 4 KB store per program).
BLOCK_FILL = 1024
# probe_centroids: table entries per program (a [128, 32] fp32 tile, 32 registers a thread over
# 4 warps) and the widest table it reads (query_maxlen); wider tables take torch's reductions.
PROBE_TILE, MAX_PROBE_COLUMNS = 4096, 256


def _check(centroid_scores, codes, offsets, pids, keep, valid, num_used, validate):
    checks.check_tensor("centroid_scores", centroid_scores, dims=(2,), dtypes=checks.FLOAT_DTYPES)
    device = centroid_scores.device
    checks.check_tensor("codes", codes, dims=(1,), dtypes=checks.INDEX_DTYPES, device=device)
    num_centroids = centroid_scores.shape[0]
    if keep is not None:
        checks.check_tensor("keep", keep, dims=(1,), dtypes=(torch.bool,), device=device)
        if keep.numel() != num_centroids:
            raise ValueError(
                f"keep must have one entry per centroid ({num_centroids}), got {checks.describe(keep)}"
            )
    checks.check_offsets_shape(offsets, device)
    checks.pids_shape(pids, device)
    if validate:
        batch = checks.DataChecks()
        batch.offsets(offsets, codes.numel())
        batch.in_range("pids", pids, 0, offsets.numel() - 1)
        batch.in_range("codes", codes, 0, num_centroids,
                       f"[0, {num_centroids}) (one row of centroid_scores each)")
        batch.run()
        pids = checks.unit_stride(pids)
    num_slots = offsets.numel() - 1 if pids is None else pids.numel()
    if valid is not None:
        checks.check_tensor("valid", valid, dims=(1,), dtypes=(torch.bool,), device=device)
        if valid.numel() != num_slots:
            raise ValueError(f"valid must have {num_slots} entries (one per pid), got {checks.describe(valid)}")
    if num_used is not None:
        checks.check_tensor("num_used", num_used, dims=(0, 1), dtypes=checks.INDEX_DTYPES, device=device)
        if num_used.numel() != 1:
            raise ValueError(f"num_used must hold one count, got {checks.describe(num_used)}")
        if validate:
            batch = checks.DataChecks()
            batch.in_range("num_used", num_used, 0, num_slots + 1, f"[0, {num_slots}] (a slot count)")
            batch.run()
    return pids


def centroid_interaction(
    centroid_scores: torch.Tensor,
    codes: torch.Tensor,
    offsets: torch.Tensor,
    pids: torch.Tensor | None = None,
    *,
    keep: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    unmatched: float | None = None,
    num_used: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """PLAID's centroid interaction, stages 2-3, fused into one launch.

        score[m] = Σ_i max_{t ∈ doc pids[m], keep[codes[t]]} centroid_scores[codes[t], i]

    Semantics are those of :func:`tilemaxsim_plaid.reference.centroid_interaction`: a document
    with no kept token scores -inf, a slot with ``valid[m] == False`` scores -inf without
    reading its document.

    Args:
        centroid_scores: [C, Lq] fp16/fp32, ``centroids @ Q.T`` for one query.
        codes: [T] int32/int64 centroid id per packed token (rows past offsets[-1] are never read).
        offsets: [N+1] int64 document boundaries.
        pids: optional [M] int32/int64 documents to score (default: all N).
        keep: optional [C] bool pruning mask (stage 2); None keeps every centroid (stage 3).
        valid: optional [M] bool; False marks an unused slot of a fixed-size candidate list.
        unmatched: optional score of one query token for which a used slot's document has no
            kept token; such a document then scores ``unmatched * Lq`` instead of -inf (PLAID's
            -9999 per token). Unused slots stay -inf.
        num_used: optional one-element int32/int64 tensor on the device: the slots at and past
            its value are unused and score -inf without being read (a fixed-capacity candidate
            list whose used slots come first, as ``torch.nonzero_static`` leaves them). The
            launch is then a fixed grid whose programs visit only the used slots, so its cost
            follows the count on the device, not the capacity, with no host sync.
        validate: False skips the checks that read device values (pid and code ranges,
            monotonic offsets); True reads them in one host sync, none for tensors checked
            before unchanged (same object and version).

    Returns:
        [M] fp32 on ``centroid_scores.device``.
    """
    pids = _check(centroid_scores, codes, offsets, pids, keep, valid, num_used, validate)
    num_slots = offsets.numel() - 1 if pids is None else pids.numel()
    out = torch.empty(num_slots, dtype=torch.float32, device=centroid_scores.device)
    if num_slots == 0:
        return out
    Lq = centroid_scores.shape[1]
    # Dummy pointers for the disabled inputs: the constexpr flags keep them unread.
    pids_arg = pids if pids is not None else offsets
    keep_arg = keep.view(torch.int8) if keep is not None else offsets
    valid_arg = valid.view(torch.int8) if valid is not None else offsets
    num_used_arg = num_used.reshape(1) if num_used is not None else offsets
    grid = num_slots if num_used is None else min(num_slots, persistent_programs(out.device))
    total = None
    for q0 in range(0, max(Lq, 1), MAX_LQ_PER_LAUNCH):
        columns = centroid_scores[:, q0 : q0 + MAX_LQ_PER_LAUNCH]
        width = columns.shape[1]
        target = out if total is None else torch.empty_like(out)
        _centroid_interaction_kernel[(grid,)](
            columns, columns.stride(0), columns.stride(1),
            codes, offsets, pids_arg, keep_arg, valid_arg, num_used_arg, target, num_slots, width,
            0.0 if unmatched is None else float(unmatched),
            HAS_PIDS=pids is not None,
            HAS_KEEP=keep is not None,
            HAS_VALID=valid is not None,
            HAS_UNMATCHED=unmatched is not None,
            HAS_NUM_USED=num_used is not None,
            BLOCK_T=BLOCK_T,
            BLOCK_Q=max(16, pow2(max(width, 1))),
            BLOCK_FILL=BLOCK_FILL,
            num_warps=NUM_WARPS,
        )
        total = target if total is None else total.add_(target)
    return total


def probe_centroids(centroid_scores: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's reductions of one query's centroid-score table, reading it once.

    Equal to ``(centroid_scores.argmax(0), centroid_scores.max(-1).values >= threshold)`` bit
    for bit, NaN included (torch's semantics: a NaN is a column's largest value, and a row
    holding one is never kept); ties go to the first centroid. Two torch passes over a [C, 32]
    fp32 table at C = 2^18 read it twice, the argmax along its strided dimension.

    Args:
        centroid_scores: [C, R] fp16/fp32, C >= 1 and 1 <= R <= MAX_PROBE_COLUMNS, any strides.
        threshold: PLAID's ``centroid_score_threshold``.

    Returns:
        (cells [R] int64, each query column's best centroid; keep [C] bool).
    """
    checks.check_tensor("centroid_scores", centroid_scores, dims=(2,), dtypes=checks.FLOAT_DTYPES)
    C, R = centroid_scores.shape
    if C == 0 or not 1 <= R <= MAX_PROBE_COLUMNS:
        raise ValueError(f"centroid_scores must be [C >= 1, 1 <= R <= {MAX_PROBE_COLUMNS}], "
                         f"got {checks.describe(centroid_scores)}")
    device = centroid_scores.device
    block_r = max(16, pow2(R))
    block_c = PROBE_TILE // block_r
    programs = cdiv(C, block_c)
    keep = torch.empty(C, dtype=torch.bool, device=device)
    # Per block and column, stored column-major: the reduction over blocks then runs along
    # contiguous rows, not along the strided dimension (results/profile/h200-665b5b8-search).
    block_max = torch.empty(block_r, programs, dtype=torch.float32, device=device)
    block_arg = torch.empty(block_r, programs, dtype=torch.int32, device=device)
    _probe_centroids_kernel[(programs,)](
        centroid_scores, centroid_scores.stride(0), centroid_scores.stride(1),
        keep.view(torch.int8), block_max, block_arg, C, R, float(threshold),
        BLOCK_C=block_c, BLOCK_R=block_r, num_warps=NUM_WARPS,
    )
    return cells_from_blocks(block_max, block_arg, R), keep


def cells_from_blocks(block_max: torch.Tensor, block_arg: torch.Tensor, R: int) -> torch.Tensor:
    """[R] int64: each column's first argmax over the table, from the per-block maxima and
    first argmaxes [>= R, blocks] of ``kernels.maxsim_centroid.probe_tile``."""
    best_block = block_max[:R].argmax(1)
    return block_arg[:R].gather(1, best_block[:, None]).flatten().to(torch.int64)
