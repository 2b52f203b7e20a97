"""The two ways the plugin computes PLAID's stages 2-4: Triton kernels or plain torch.

* ``"triton"`` (default on CUDA): the fused centroid-interaction kernel for stages 2-3 and the
  residual MaxSim kernel (decompression fused into the score) for stage 4. Every size is fixed
  on the host beforehand, so no call here synchronises with the device.
* ``"torch"`` (default on CPU): the same math in vectorised fp32 torch. Triton kernels need a
  GPU (the CPU interpreter is for tests), and colbert-ai's own CPU path floors negative maxima
  at 0 and needs a C++ compiler, so a correct torch implementation is the CPU path: it gives
  the exact fp32 MaxSim rankings the GPU path gives, only slower.

``TILEMAXSIM_PLAID_BACKEND=triton|torch`` overrides the choice (tests run the Triton path on
CPU tensors under ``TRITON_INTERPRET=1``); :mod:`tilemaxsim_plaid.plaid.environment` reads and
checks it, and ``TILEMAXSIM_PLAID_PRODUCTS``, which picks how the fused stage 4 multiplies.
"""

from __future__ import annotations

import functools
import logging

import torch

from tilemaxsim_plaid.plaid import counters
from tilemaxsim_plaid.plaid.device_index import DeviceIndex
from tilemaxsim_plaid.plaid.environment import (
    BACKEND_ENV_VAR,
    PRODUCTS,
    PRODUCTS_ENV_VAR,
    backend_for,
    stage_4_products,
)
from tilemaxsim_plaid.plaid.extensions import packed_token_rows
from tilemaxsim_plaid.reference import segment_maxsim

__all__ = [
    "BACKEND_ENV_VAR",
    "PRODUCTS",
    "PRODUCTS_ENV_VAR",
    "stage_4_products",
    "products_for",
    "resolved_products",
    "centroid_table",
    "uses_centroid_table",
    "fused_residual_op",
    "sorts_in_one_program",
    "cublas_fp32_is_exact",
    "backend_for",
    "probe_centroids",
    "centroid_interaction",
    "mark_probed_documents",
    "sort_candidates",
    "top_candidates",
    "exact_scores",
    "decompress_tokens",
    "segment_maxsim",
]

logger = logging.getLogger(__name__)

# Decompressed tokens per stage-4 chunk: 2**18 x 128 dims x 4 B = 128 MiB of fp32 at most,
# so a rerank of 1M candidates streams through a bounded buffer instead of running out of memory.
TOKENS_PER_CHUNK = 1 << 18


# Products modes already warned about falling back to tf32x3 (once per process each).
_warned_no_table: dict[str, bool] = {}


def uses_centroid_table(index: DeviceIndex, num_query_tokens: int) -> bool:
    """Whether stage 4 takes the centroid part of its scores from centroid-score tables of the
    query (fp32: the fp16 products are multiplied against an fp32 query's table): precomputed
    inverse norms, a query the kernel scores in one launch, and a table the residual op serves,
    whole or split by query rows (``ops.residual.centroid_table_tiles``: one query of up to
    WHOLE_TABLE_ROWS tokens takes its table whole at any C)."""
    from tilemaxsim_plaid.ops.launch import MAX_LQ_PER_LAUNCH
    from tilemaxsim_plaid.ops.residual import centroid_table_tiles

    return (index.inv_norms is not None and num_query_tokens <= MAX_LQ_PER_LAUNCH
            and centroid_table_tiles(index.centroids.shape[0], 1, num_query_tokens,
                                     element_size=4) is not None)


def _gathers_centroid_rows(index: DeviceIndex, num_query_tokens: int) -> bool:
    """Whether the residual op gathers centroid rows for this query instead of reading a table
    (it logs that once): inverse norms, one launch's tokens, and no table tiles that fit."""
    from tilemaxsim_plaid.ops.launch import MAX_LQ_PER_LAUNCH

    return (index.inv_norms is not None and num_query_tokens <= MAX_LQ_PER_LAUNCH
            and not uses_centroid_table(index, num_query_tokens))


def resolved_products(index: DeviceIndex, num_query_tokens: int) -> tuple[str, bool]:
    """``(products, fell_back)``: :func:`products_for` without its log line and count;
    ``fell_back`` when an fp16 mode was asked for and tf32x3 is used instead."""
    choice = stage_4_products()
    if not uses_centroid_table(index, num_query_tokens):
        return "tf32x3", choice in ("fp16x2", "fp16")
    if choice == "auto":
        return ("fp16x2" if index.bucket_weights_in_fp16 else "tf32x3"), False
    return choice, False


_NO_TABLE = "stage 4 multiplied as tf32x3: the fp16 products need a centroid-score table"
_GATHERED = ("stage 4 gathered centroid rows: the query's centroid-score table does not fit "
             "even split by query rows")


def products_for(index: DeviceIndex, num_query_tokens: int) -> str:
    """The products the fused stage 4 uses on ``index`` for a query of ``num_query_tokens``:
    ``"auto"`` resolved, and tf32x3 wherever the fp16 modes cannot keep the centroid part of
    each score exact, which takes the table path (:func:`uses_centroid_table`)."""
    products, fell_back = resolved_products(index, num_query_tokens)
    if fell_back:
        choice = stage_4_products()
        counters.count_fallback(_NO_TABLE)
        if not _warned_no_table.get(choice):
            _warned_no_table[choice] = True
            logger.warning("%s=%s needs the query's centroid-score tables, which this index or "
                           "query cannot use even split by query rows (%d centroids, %d query "
                           "tokens): stage 4 multiplies as tf32x3", PRODUCTS_ENV_VAR, choice,
                           index.centroids.shape[0], num_query_tokens)
    return products


def decompress_tokens(index: DeviceIndex, rows: torch.Tensor) -> torch.Tensor:
    """PLAID's decompressed embeddings of the given token rows, in fp32.

    ``normalize(centroids[code] + bucket_weights[bucket])``: exactly colbert-ai's CPU
    decompression (fp32 add, then L2 normalisation).

    Args:
        index: the device index.
        rows: int64 token rows of any shape S.

    Returns:
        [*S, dim] fp32.
    """
    flat = rows.reshape(-1)
    # [256, 8 / nbits]: the weights of each residual byte's dimension slots, so one lookup per
    # byte gives the same values as bucket_weights[bucket] one dimension at a time, without
    # materialising an int64 bucket index per dimension.
    byte_weights = index.bucket_weights[index.bucket_table.long()]
    residual_bytes = index.residuals.index_select(0, flat).reshape(-1).int()
    embeddings = index.centroids.index_select(0, index.codes.index_select(0, flat))
    embeddings += byte_weights.index_select(0, residual_bytes).reshape(flat.shape[0], index.dim)
    embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=-1)
    return embeddings.reshape(*rows.shape, index.dim)


def probe_centroids(index, centroid_scores: torch.Tensor, ncells: int, threshold: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's cells and stage 2's pruning mask from one query's [C, Lq] table:
    ``(the ncells best centroids of each query column, flattened; keep [C] bool, a centroid
    whose best query score reaches threshold)``. On the Triton backend one launch reads the
    table for both (ops.centroid.probe_centroids; torch's topk still picks ncells > 1)."""
    C, columns = centroid_scores.shape
    if backend_for(index.device) == "triton" and C >= 1:
        from tilemaxsim_plaid.ops.centroid import MAX_PROBE_COLUMNS
        from tilemaxsim_plaid.ops.centroid import probe_centroids as fused

        if 1 <= columns <= MAX_PROBE_COLUMNS:
            cells, keep = fused(centroid_scores, threshold)
            if ncells > 1:
                cells = centroid_scores.topk(ncells, dim=0, sorted=False).indices.flatten()
            return cells, keep
    keep = centroid_scores.max(-1).values >= threshold
    if ncells == 1:
        return centroid_scores.argmax(dim=0), keep
    return centroid_scores.topk(ncells, dim=0, sorted=False).indices.flatten(), keep


def centroid_interaction(index, centroid_scores, pids, *, keep=None, valid=None, unmatched=None,
                         num_used=None) -> torch.Tensor:
    """Stages 2-3 on the index's backend. Arguments and shapes as in
    :func:`tilemaxsim_plaid.ops.centroid.centroid_interaction` (``unmatched`` included);
    ``num_used`` must agree with ``valid`` (no valid slot at or past it): the Triton launch then
    visits only the used slots, and the torch path, which reads ``valid``, ignores it."""
    if backend_for(index.device) == "triton":
        from tilemaxsim_plaid.ops.centroid import centroid_interaction as fused

        return fused(centroid_scores, index.codes, index.offsets, pids, keep=keep, valid=valid,
                     unmatched=unmatched, num_used=num_used, validate=False)
    from tilemaxsim_plaid.reference import centroid_interaction as vectorised

    scores = vectorised(centroid_scores, index.codes, index.offsets, pids, keep=keep, valid=valid,
                        dtype=torch.float32)
    if unmatched is None:
        return scores
    # A document scores -inf exactly when every query token's max is -inf: all of them unmatched.
    floored = torch.isneginf(scores) if valid is None else torch.isneginf(scores) & valid
    return scores.masked_fill(floored, unmatched * centroid_scores.shape[1])


def mark_probed_documents(index, cells: torch.Tensor) -> torch.Tensor:
    """[num_docs + 1] bool: True for every document in the inverted list of any of ``cells``
    (slot num_docs is scratch). No host sync on either backend."""
    bitmap = torch.zeros(index.num_docs + 1, dtype=torch.bool, device=index.device)
    if backend_for(index.device) == "triton":
        from tilemaxsim_plaid.ops.ivf import mark_probed_documents as fused

        fused(bitmap, cells, index.ivf_offsets, index.ivf_lengths, index.ivf_pids, index.max_ivf_length)
        return bitmap
    # Every probed list padded to the longest list (a host constant): fixed shape.
    width = max(index.max_ivf_length, 1)
    positions = torch.arange(width, device=index.device)
    in_list = positions[None, :] < index.ivf_lengths[cells][:, None]
    entries = (index.ivf_offsets[cells][:, None] + positions[None, :]).clamp_(max=max(index.ivf_pids.numel() - 1, 0))
    members = torch.where(in_list, index.ivf_pids[entries].long(), index.num_docs)
    # Slot num_docs collects the padding. index_fill_ takes the value as a kernel argument;
    # `bitmap[i] = True` would copy a host scalar, which a CUDA graph cannot capture.
    bitmap.index_fill_(0, members.flatten(), True)
    return bitmap


def sort_candidates(index, pids: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor | None):
    """``(pids, scores, valid)`` in descending score order (unused slots last; valid may be None).

    On the Triton backend a list of up to :data:`~tilemaxsim_plaid.ops.sort.MAX_SORTED_IN_ONE_PROGRAM`
    slots (every search's final list) is sorted in one launch, ties by pid; longer ones (reranks)
    and the torch backend use ``torch.sort``, whose ties fall in any order."""
    if sorts_in_one_program(index, pids):
        from tilemaxsim_plaid.ops.sort import sort_candidates as fused

        return fused(pids, scores, valid)
    order = torch.sort(scores, descending=True).indices
    return pids[order], scores[order], None if valid is None else valid[order]


def top_candidates(index, pids: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor | None, count: int):
    """``(pids, valid)`` of the ``count`` best-scoring slots (``count < len(pids)``).

    Where the one-program sort applies (:func:`sort_candidates`) the best ``count`` are the
    head of the sorted list, views with no further launch (ties at the cut by pid); otherwise
    ``torch.topk`` and two gathers (ties at the cut in any order, as upstream's)."""
    if sorts_in_one_program(index, pids):
        from tilemaxsim_plaid.ops.sort import sort_candidates as fused

        pids, _, valid = fused(pids, scores, valid)
        return pids[:count], valid[:count]
    top = torch.topk(scores, k=count).indices
    return pids[top], (None if valid is None else valid[top])


def sorts_in_one_program(index, pids: torch.Tensor) -> bool:
    from tilemaxsim_plaid.ops.sort import MAX_SORTED_IN_ONE_PROGRAM

    return (backend_for(index.device) == "triton" and index.num_docs < 2**31
            and 0 < pids.numel() <= MAX_SORTED_IN_ONE_PROGRAM)


_NO_FUSED_KERNEL = "stage 4 decompressed before scoring: the fused residual kernel is unavailable"


@functools.cache
def fused_residual_op():
    """``tilemaxsim_plaid.ops.residual.maxsim_residual`` when it is available, else None."""
    try:
        from tilemaxsim_plaid.ops.residual import maxsim_residual
    except ImportError as error:
        logger.warning("stage 4 decompresses before scoring (fused residual kernel unavailable: %s)", error)
        return None
    return maxsim_residual


def centroid_table(index: DeviceIndex, Q: torch.Tensor) -> torch.Tensor:
    """[C, Lq] fp32 ``centroids @ Q.T``: candidate generation's scores, and the exact centroid
    part of every stage-4 score on the Triton backend."""
    if index.device.type == "cuda" and not cublas_fp32_is_exact():
        from tilemaxsim_plaid.ops.residual import query_centroid_scores

        # The process enabled TF32 for fp32 matmuls (torch.set_float32_matmul_precision("high")):
        # cuBLAS would round this table, and with it every exact score, to 10 mantissa bits, so
        # our tf32x3 kernel computes it instead (46 us for C = 65,536 and 32 query tokens on an
        # H200; cuBLAS's fp32 GEMM is faster, which is why it stays the default).
        return query_centroid_scores(Q[None], index.centroids)
    return index.centroids @ Q.T  # [C, dim] @ [dim, Lq] -> [C, Lq]


def cublas_fp32_is_exact() -> bool:
    """Whether cuBLAS multiplies fp32 matrices in fp32 (not TF32) under the current settings."""
    matmul = torch.backends.cuda.matmul
    try:
        return not matmul.allow_tf32
    except RuntimeError:  # set through the newer ``fp32_precision`` API, which then must be read
        return getattr(matmul, "fp32_precision", "tf32") == "ieee"


def _exact_scores_triton(index, Q, pids, valid, centroid_scores=None):
    residual_kernel = fused_residual_op()
    if residual_kernel is not None:
        if centroid_scores is not None and (index.inv_norms is None or centroid_scores.shape[1] != Q.shape[0]):
            centroid_scores = None  # stage 1 saw only the first query_maxlen tokens
        products = products_for(index, Q.shape[0])
        if _gathers_centroid_rows(index, Q.shape[0]):
            counters.count_fallback(_GATHERED)
        centroids = index.centroids
        if centroid_scores is None and uses_centroid_table(index, Q.shape[0]):
            if products == "fp16x2" and index.centroids_half is not None:
                # A rerank (no stage 1): one launch builds the table from the fp16 centroids and
                # splits the query into its fp16 halves (split_query_centroid_scores).
                centroids = index.centroids_half
            else:
                # A rerank: the same table as candidate generation's, from cuBLAS.
                centroid_scores = centroid_table(index, Q)
        if products == "fp16":
            Q = Q.half()  # the centroid part comes from the fp32 query's table: exact
        scores = residual_kernel(Q[None], index.codes, index.residuals, index.offsets,
                                 centroids, index.bucket_weights, index.nbits, pids,
                                 inv_norms=index.inv_norms, centroid_scores=centroid_scores,
                                 split_query=products == "fp16x2", validate=False)[0]
    else:
        from tilemaxsim_plaid.ops.dense import maxsim_padded

        # Padded to the longest document (a host constant), so the buffer size needs no sync.
        width = max(index.max_doclen, 1)
        lengths = index.doclens[pids]
        if valid is not None:
            lengths = torch.where(valid, lengths, torch.zeros_like(lengths))
        positions = torch.arange(width, device=Q.device)
        rows = (index.offsets[pids][:, None] + positions[None, :]).clamp_(max=max(index.num_tokens - 1, 0))
        D = decompress_tokens(index, rows)  # [M, width, dim]
        scores = maxsim_padded(Q[None], D, lengths, validate=False)[0]
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    return scores


def _exact_scores_torch(index, Q, pids, valid):
    lengths = index.doclens[pids]
    if valid is not None:
        lengths = torch.where(valid, lengths, torch.zeros_like(lengths))
    rows = packed_token_rows(index.offsets[pids], lengths)
    sim = decompress_tokens(index, rows) @ Q.T  # [T', dim] @ [dim, Lq] -> [T', Lq]
    return segment_maxsim(sim, lengths)


def exact_scores(index: DeviceIndex, Q: torch.Tensor, pids: torch.Tensor,
                 valid: torch.Tensor | None = None,
                 centroid_scores: torch.Tensor | None = None) -> torch.Tensor:
    """Stage 4: exact fp32 MaxSim of one query against PLAID's decompressed documents.

    Paths that decompress are chunked so that at most ~TOKENS_PER_CHUNK decompressed tokens exist
    at once (the chunk size in documents comes from the longest document, a host constant, so no
    sync); the fused residual kernel needs no chunking and runs as one launch.

    Args:
        index: the device index.
        Q: [Lq, dim] fp32 on the index's device.
        pids: [M] int64 documents (in range; unchecked here).
        valid: optional [M] bool; False slots score -inf.
        centroid_scores: optional fp32 [C, Lq] ``centroids @ Q^T`` from candidate generation;
            the fused kernel reuses it as its per-query centroid table instead of rebuilding it.

    Returns:
        [M] fp32.
    """
    triton_backend = backend_for(index.device) == "triton"
    if triton_backend and fused_residual_op() is None:
        counters.count_fallback(_NO_FUSED_KERNEL)
    if triton_backend and fused_residual_op() is not None:
        # The fused kernel decodes in registers and reads the candidates in place: nothing grows
        # with the number of candidates but the [M] output, so one launch scores them all.
        return _exact_scores_triton(index, Q, pids, valid, centroid_scores)
    out = torch.empty(pids.numel(), dtype=torch.float32, device=Q.device)
    docs_per_chunk = max(1, TOKENS_PER_CHUNK // max(index.max_doclen, 1))
    score_chunk = _exact_scores_triton if triton_backend else _exact_scores_torch
    for start in range(0, pids.numel(), docs_per_chunk):
        chunk = slice(start, start + docs_per_chunk)
        out[chunk] = score_chunk(index, Q, pids[chunk], None if valid is None else valid[chunk])
    return out
