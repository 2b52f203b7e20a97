"""RAGatouille's in-memory rerank on the TileMaxSim kernels, with RAGatouille's own semantics.

RAGatouille 0.0.9 (``RAGPretrainedModel.rerank`` -> ``ColBERT.rank`` ->
``ColBERT._index_free_search``, and ``search_encoded_docs``) scores with
``ragatouille.models.colbert.ColBERT._colbert_score(self, Q, D_padded, D_mask)``:

    score[n] = sum_s max_t <Q[b, s], D[n, t]>,   b = 0 when Q has one query, else b = n

over every row of ``D_padded``: ``D_mask`` (all ``-inf``, built by ``_encode_index_free_documents``)
is not read, and the zero rows colbert-ai's ``docFromText(keep_dims=True)`` pads with are scored as
tokens (similarity 0, which wins the max when every real similarity is negative). No
normalisation (colbert-ai normalised the embeddings); Q is cast to D's dtype; the result has D's
dtype. Upstream moves the three tensors to CUDA when ColBERTConfig sees a GPU.

:func:`colbert_score` computes the same thing with the dense kernel (``maxsim_padded`` without
``doc_lengths``: every row is a token, exactly upstream's max), in fp32, rounded once to D's
dtype. One query against all documents (what ``rerank`` and ``search_encoded_docs`` pass) takes
the kernels; everything else runs RAGatouille's own method with the same arguments (logged at
DEBUG, counted in :func:`tilemaxsim_plaid.stats` ``fallbacks``): one query per document, tensors
not on one CUDA device, no triton, dtypes other than fp16/bf16/fp32, empty inputs, shapes
upstream's asserts reject (they raise there, as before), and inputs that require grad.

The registry patches it (:data:`tilemaxsim_plaid.plaid.targets.RAGATOUILLE_TARGETS`) as part of the
plugin, when ``ragatouille.models.colbert`` finishes importing. Module graph: this module ->
:mod:`tilemaxsim_plaid.ops.dense` (kernel path), :mod:`tilemaxsim_plaid.pylate` (the tensor
checks shared with PyLate's backend), :mod:`tilemaxsim_plaid.plaid.counters`.
"""

from __future__ import annotations

import logging

import torch

from tilemaxsim_plaid.plaid import counters, registry
from tilemaxsim_plaid.pylate import tensor_refusal

__all__ = ["colbert_score", "ragatouille_version"]

logger = logging.getLogger(__name__)

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Why a call went to RAGatouille's own code: fixed sentences, the keys of stats().fallbacks.
_SHAPES = "shapes other than Q [1, Lq, d] and D_padded [N, Ld, d]"
_PAIRWISE = "one query per document (Q [N, Lq, d])"
_DTYPE = "a dtype other than fp16/bf16/fp32"
_EMPTY = "empty inputs"


def ragatouille_version() -> str | None:
    """Installed RAGatouille version, or None when it is not installed."""
    return registry.installed_version("ragatouille")


def _fall_back(reason: str) -> None:
    logger.debug("tilemaxsim_plaid.ragatouille: _colbert_score runs RAGatouille's own code: %s",
                 reason)
    counters.count_fallback(f"ragatouille.colbert_score: {reason}")


def _shape_refusal(Q: torch.Tensor, D: torch.Tensor) -> str | None:
    if Q.dim() != 3 or D.dim() != 3 or Q.shape[-1] != D.shape[-1]:
        return _SHAPES
    if Q.shape[0] != 1:
        return _PAIRWISE if Q.shape[0] == D.shape[0] else _SHAPES
    if D.dtype not in _KERNEL_DTYPES or Q.dtype not in _KERNEL_DTYPES:
        return _DTYPE
    if Q.numel() == 0 or D.numel() == 0:
        return _EMPTY
    return None


def colbert_score(original, model, Q, D_padded, D_mask):
    """``ragatouille.models.colbert.ColBERT._colbert_score`` on the kernels.

    Args:
        original: RAGatouille's method (called where the kernels do not apply).
        model: the ``ColBERT`` instance.
        Q: [1, Lq, d] query embeddings (or [N, Lq, d], one per document: upstream's code).
        D_padded: [N, Ld, d] documents, zero-padded; every row is scored as a token.
        D_mask: [N, Ld]; not read, as upstream does not read it.

    Returns:
        [N] scores in ``D_padded``'s dtype, on the device upstream computes on.
    """
    from colbert.infra import ColBERTConfig

    if ColBERTConfig().total_visible_gpus > 0:
        # Upstream's own move, so both paths see the same tensors.
        Q, D_padded, D_mask = Q.cuda(), D_padded.cuda(), D_mask.cuda()
    reason = tensor_refusal([Q, D_padded]) or _shape_refusal(Q, D_padded)
    if reason is not None:
        _fall_back(reason)
        return original(model, Q, D_padded, D_mask)
    from tilemaxsim_plaid.ops.dense import maxsim_padded

    scores = maxsim_padded(Q[0].to(D_padded.dtype), D_padded)  # [Lq, d] vs [N, Ld, d] -> fp32 [N]
    return scores.to(D_padded.dtype)
