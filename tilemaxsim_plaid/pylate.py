"""PyLate's ColBERT scoring on the TileMaxSim kernels, with PyLate's own semantics.

Three functions with the signatures of :mod:`pylate.scores` (``colbert_scores``,
``colbert_scores_pairwise``, ``colbert_kd_scores``), and :func:`patch_pylate` /
:func:`unpatch_pylate`, which put them in place of PyLate's so that ``pylate.rank.rerank``,
``ColBERTScores``, the model's ``similarity`` and the evaluators score with them.

**Semantics are PyLate's torch path, not ours.** PyLate masks by multiplying token similarities:

    score[a, b] = sum_s  qmask[a, s] * max_t ( <Q[a, s], D[b, t]> * dmask[b, t] )

so a masked document token is a similarity of 0, and so is a zero-padded one (``rerank`` pads with
zeros and passes no mask): it wins the max whenever every real token's similarity is negative.
Our kernels (and :mod:`tilemaxsim_plaid.reference`) give a padded token -inf, which never wins.
The backend reproduces PyLate's rule by scaling the embeddings instead of the similarities,
``<Q * qm, D * dm> = qm * dm * <Q, D>``, and scoring every padded row as a real token. That is
exact for 0/1 (or bool) masks, which is what PyLate's collator and tokenizer produce; other mask
weights are applied to the embeddings in their dtype, equal up to rounding. A documents mask costs
one masked copy of the documents. Scores are computed in fp32 and returned in the dtype PyLate
returns (the embeddings' dtype promoted with the masks' dtypes), rounded once.

**Where the kernels do not apply, PyLate's own function runs** with the same arguments (logged at
DEBUG and counted in :func:`tilemaxsim_plaid.stats` ``fallbacks``), so the result is always
PyLate's: tensors not on one CUDA device, no triton, a dtype other than fp16/bf16/fp32 or
differing between queries and documents, empty inputs or a document of no tokens, masks not of
the embeddings' [batch, tokens] shape, an explicit ``backend`` other than ``"auto"`` (argument or
``PYLATE_SCORES_BACKEND``), and inputs that need autograd: PyLate trains through these functions
(``ColBERTScores``, ``Distillation``) and the kernels have no backward, so when grad mode is on
and any input requires grad, PyLate's torch path computes the scores and their gradients.

``pylate`` is imported only when a call needs it (a fallback, or patching); the kernel path itself
needs only torch and triton. :func:`patch_pylate` and :func:`unpatch_pylate` apply and revert the
registry's PyLate targets (:data:`tilemaxsim_plaid.plaid.targets.PYLATE_TARGETS`). Module graph:
this module -> :mod:`tilemaxsim_plaid.ops.dense` (kernel path),
:mod:`tilemaxsim_plaid.plaid.counters`, :mod:`tilemaxsim_plaid.plaid.registry`,
``pylate.scores.colbert``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tilemaxsim_plaid.plaid import counters, registry
from tilemaxsim_plaid.plaid.registry import SUPPORTED_PYLATE_VERSIONS
from tilemaxsim_plaid.triton_support import interpreting, triton_problem

__all__ = [
    "SUPPORTED_PYLATE_VERSIONS",
    "active_bindings",
    "colbert_kd_scores",
    "colbert_scores",
    "colbert_scores_pairwise",
    "is_patched",
    "patch_pylate",
    "pylate_version",
    "unpatch_pylate",
]

logger = logging.getLogger(__name__)

# Where the three functions are defined (PyLate <= 1.4 had them in pylate.scores.scores).
DEFINING_MODULE = "pylate.scores.colbert"
# The registry's name for PyLate (tilemaxsim_plaid.plaid.registry.LIBRARIES).
_LIBRARY = ("pylate",)
# PyLate's environment override of the ``backend`` argument, read on every call as PyLate does.
BACKEND_ENV_VAR = "PYLATE_SCORES_BACKEND"
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Why a call went to PyLate's own code: fixed sentences, the keys of stats().fallbacks.
_BACKEND = "a backend other than 'auto' was asked for"
_NOT_TENSORS = "inputs that are not tensors"
_GRAD = "inputs that require grad (the kernels have no backward)"
_DEVICES = "tensors on different devices"
_NOT_CUDA = "tensors not on a CUDA device"
_SHAPES = "embedding shapes outside PyLate's documented layout"
_DTYPE = "a dtype other than fp16/bf16/fp32, or differing between queries and documents"
# An empty document has no max (PyLate raises), an empty batch nothing to launch.
_EMPTY = "empty inputs or a document of no tokens"
_MASK = "a mask not of the embeddings' [batch, tokens] shape"
_NO_TRITON = "no triton the kernels build with (tilemaxsim_plaid.triton_support)"


# Tests only: take the kernel path for CPU tensors too (the kernels then run under
# TRITON_INTERPRET=1). See _kernels_on_cpu().
_KERNELS_ON_CPU = False


@contextlib.contextmanager
def _kernels_on_cpu() -> Iterator[None]:
    """Within the block, CPU tensors take the kernel path when ``TRITON_INTERPRET=1`` (tests)."""
    global _KERNELS_ON_CPU
    before, _KERNELS_ON_CPU = _KERNELS_ON_CPU, True
    try:
        yield
    finally:
        _KERNELS_ON_CPU = before


# -------------------------------------------------------------------------------------------
# When the kernels apply


def _fall_back(function: str, reason: str) -> None:
    logger.debug("tilemaxsim_plaid.pylate: %s runs PyLate's own code: %s", function, reason)
    counters.count_fallback(f"pylate.{function}: {reason}")


def _wants_kernels(backend: str | None) -> bool:
    # PyLate resolves None through its environment variable on every call; "auto" lets the
    # library choose (PyLate: flash, then LIK, then torch), so it is where ours is chosen.
    resolved = backend if backend is not None else os.environ.get(BACKEND_ENV_VAR, "auto")
    return isinstance(resolved, str) and resolved.lower() == "auto"


def _refusal(tensors: list[Any], backend: str | None) -> str | None:
    """Why the kernels cannot score these inputs (a fixed sentence), or None when they can."""
    if not _wants_kernels(backend):
        return _BACKEND
    return tensor_refusal(tensors)


def tensor_refusal(tensors: list[Any]) -> str | None:
    """Why the kernels cannot take these tensors, whatever their shapes (a fixed sentence:
    not tensors, autograd, devices, no triton), or None when they can. Shared with
    :mod:`tilemaxsim_plaid.ragatouille`."""
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return _NOT_TENSORS
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _GRAD
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        return _DEVICES
    on_cpu = device.type == "cpu" and _KERNELS_ON_CPU and interpreting()
    if device.type != "cuda" and not on_cpu:
        return _NOT_CUDA
    if not _triton_installed():
        # Where triton has no wheel (Windows) or is older than the kernels need, PyLate's path
        # serves, as it did before the patch.
        return _NO_TRITON
    return None


def _triton_installed() -> bool:
    """A triton the kernels build with is installed (triton_support)."""
    return triton_problem() is None


def _embedding_refusal(Q: torch.Tensor, D: torch.Tensor, q_dims: int, d_dims: int,
                       batched_docs: bool = False) -> str | None:
    """Shapes, dtype and sizes; ``batched_docs``: D's first axis is Q's batch (the KD layout)."""
    if (Q.dim() != q_dims or D.dim() != d_dims or Q.shape[-1] != D.shape[-1]
            or (batched_docs and Q.shape[0] != D.shape[0])):
        return _SHAPES
    if Q.dtype not in _KERNEL_DTYPES or D.dtype != Q.dtype:
        return _DTYPE
    if Q.numel() == 0 or D.numel() == 0:
        return _EMPTY
    return None


def _mask_refusal(mask: torch.Tensor | None, shape: torch.Size) -> str | None:
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != shape):
        return _MASK
    return None


def _result_dtype(dtype: torch.dtype, *masks: torch.Tensor | None) -> torch.dtype:
    # PyLate multiplies the similarities by each mask: ordinary type promotion, e.g. fp16
    # embeddings with a float32 mask return float32, with a bool or int64 mask float16.
    for mask in masks:
        if mask is not None:
            dtype = torch.promote_types(dtype, mask.dtype)
    return dtype


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x * mask`` per token, in x's dtype: a 0/1 mask zeroes tokens exactly."""
    return x if mask is None else x * mask.to(x.dtype)[..., None]


def _maxsim_padded():
    from tilemaxsim_plaid.ops.dense import maxsim_padded

    return maxsim_padded


# -------------------------------------------------------------------------------------------
# PyLate's side


def pylate_version() -> str | None:
    """Installed PyLate version, or None when it is not installed."""
    return registry.installed_version("pylate")


def _convert(x: Any) -> Any:
    # PyLate's own conversion (lists of lists, numpy arrays, lists of tensors), so both paths see
    # the same tensor.
    if x is None or isinstance(x, torch.Tensor):
        return x
    from pylate.utils.tensor import convert_to_tensor

    return convert_to_tensor(x)


def _pylate_function(name: str) -> Callable:
    """PyLate's own function: the original while patched, else what the defining module holds."""
    function = getattr(importlib.import_module(DEFINING_MODULE), name)
    if function is registry.active_bindings(_LIBRARY).get(f"{DEFINING_MODULE}.{name}"):
        return function.__wrapped__
    return function


def _call_pylate(name: str, *args, **kwargs):
    # Resolved at the call, so the kernel path runs without PyLate installed.
    return _pylate_function(name)(*args, **kwargs)


# -------------------------------------------------------------------------------------------
# The three scoring functions


def _colbert_scores(original, queries_embeddings, documents_embeddings, queries_mask=None,
                    documents_mask=None, backend=None):
    Q, D = _convert(queries_embeddings), _convert(documents_embeddings)
    q_mask, d_mask = _convert(queries_mask), _convert(documents_mask)
    tensors = [Q, D] + [m for m in (q_mask, d_mask) if m is not None]
    reason = (_refusal(tensors, backend) or _embedding_refusal(Q, D, 3, 3)
              or _mask_refusal(q_mask, Q.shape[:2]) or _mask_refusal(d_mask, D.shape[:2]))
    if reason is not None:
        _fall_back("colbert_scores", reason)
        return original(Q, D, queries_mask=q_mask, documents_mask=d_mask, backend=backend)
    scores = _maxsim_padded()(_masked(Q, q_mask), _masked(D, d_mask))  # fp32 [B, N]
    return scores.to(_result_dtype(Q.dtype, q_mask, d_mask))


def colbert_scores(queries_embeddings, documents_embeddings, queries_mask=None,
                   documents_mask=None, backend=None) -> torch.Tensor:
    """``pylate.scores.colbert_scores`` on the kernels: every query against every document.

    Args:
        queries_embeddings: [B, Lq, d] (tensor, numpy array or list, as PyLate takes).
        documents_embeddings: [N, Ld, d]; padded rows are scored as they are (zeros score 0).
        queries_mask: optional [B, Lq]; a 0 drops the query token (it adds 0).
        documents_mask: optional [N, Ld]; a 0 makes the token's similarity 0 (not -inf).
        backend: PyLate's backend argument; None or ``"auto"`` lets this function choose.

    Returns:
        [B, N] in PyLate's dtype (see the module docstring). Inputs the kernels do not take
        (CPU tensors, autograd, ...) are scored by PyLate's own function.
    """
    return _colbert_scores(functools.partial(_call_pylate, "colbert_scores"), queries_embeddings,
                           documents_embeddings, queries_mask, documents_mask, backend)


def _colbert_scores_pairwise(original, queries_embeddings, documents_embeddings, backend=None):
    # PyLate zips the two and converts each item; iterate only sequences, so that a generator
    # handed over to PyLate on a fallback is still unconsumed.
    if not all(isinstance(x, (torch.Tensor, list, tuple))
               for x in (queries_embeddings, documents_embeddings)):
        reason = _NOT_TENSORS
    else:
        pairs = [(_convert(q), _convert(d))
                 for q, d in zip(queries_embeddings, documents_embeddings)]
        tensors = [t for pair in pairs for t in pair]
        reason = _refusal(tensors, backend) if pairs else _EMPTY
        if reason is None:
            dtype = tensors[0].dtype
            reason = next((r for q, d in pairs if (r := _embedding_refusal(q, d, 2, 2))), None)
            if reason is None and any(t.dtype != dtype for t in tensors):
                reason = _DTYPE
    if reason is not None:
        _fall_back("colbert_scores_pairwise", reason)
        return original(queries_embeddings, documents_embeddings, backend=backend)
    maxsim_padded = _maxsim_padded()
    # One launch per pair, as PyLate's torch path runs one product per pair.
    scores = torch.cat([maxsim_padded(q, d[None]) for q, d in pairs])  # fp32 [B]
    return scores.to(dtype)


def colbert_scores_pairwise(queries_embeddings, documents_embeddings,
                            backend=None) -> torch.Tensor:
    """``pylate.scores.colbert_scores_pairwise`` on the kernels: query i against document i.

    Args:
        queries_embeddings: [B, Lq, d] tensor, or a sequence of [Lq_i, d] tensors.
        documents_embeddings: [B, Ld, d] tensor, or a sequence of [Ld_i, d] tensors; every row
            is a token (PyLate's pairwise path takes no mask).
        backend: PyLate's backend argument; None or ``"auto"`` lets this function choose.

    Returns:
        [B] in the embeddings' dtype; PyLate's own function where the kernels do not apply.
    """
    return _colbert_scores_pairwise(functools.partial(_call_pylate, "colbert_scores_pairwise"),
                                    queries_embeddings, documents_embeddings, backend)


def _colbert_kd_scores(original, queries_embeddings, documents_embeddings, queries_mask=None,
                       documents_mask=None, backend=None):
    Q, D = _convert(queries_embeddings), _convert(documents_embeddings)
    q_mask, d_mask = _convert(queries_mask), _convert(documents_mask)
    tensors = [Q, D] + [m for m in (q_mask, d_mask) if m is not None]
    reason = (_refusal(tensors, backend) or _embedding_refusal(Q, D, 3, 4, batched_docs=True)
              or _mask_refusal(q_mask, Q.shape[:2]) or _mask_refusal(d_mask, D.shape[:3]))
    if reason is not None:
        _fall_back("colbert_kd_scores", reason)
        return original(Q, D, queries_mask=q_mask, documents_mask=d_mask, backend=backend)
    maxsim_padded = _maxsim_padded()
    Q, D = _masked(Q, q_mask), _masked(D, d_mask)
    # Each query has its own candidates: one launch per query.
    scores = torch.stack([maxsim_padded(Q[a], D[a]) for a in range(Q.shape[0])])  # fp32 [B, N]
    return scores.to(_result_dtype(Q.dtype, q_mask, d_mask))


def colbert_kd_scores(queries_embeddings, documents_embeddings, queries_mask=None,
                      documents_mask=None, backend=None) -> torch.Tensor:
    """``pylate.scores.colbert_kd_scores`` on the kernels: each query against its own documents.

    Args:
        queries_embeddings: [B, Lq, d].
        documents_embeddings: [B, N, Ld, d]: query a's N candidates.
        queries_mask: optional [B, Lq].
        documents_mask: optional [B, N, Ld]; a 0 makes the token's similarity 0 (not -inf).
        backend: PyLate's backend argument; None or ``"auto"`` lets this function choose.

    Returns:
        [B, N] in PyLate's dtype; PyLate's own function where the kernels do not apply.
    """
    return _colbert_kd_scores(functools.partial(_call_pylate, "colbert_kd_scores"),
                              queries_embeddings, documents_embeddings, queries_mask,
                              documents_mask, backend)


_IMPLEMENTATIONS = {
    "colbert_scores": _colbert_scores,
    "colbert_scores_pairwise": _colbert_scores_pairwise,
    "colbert_kd_scores": _colbert_kd_scores,
}


# -------------------------------------------------------------------------------------------
# The patch: three targets of the registry (tilemaxsim_plaid.plaid.targets.PYLATE_TARGETS)


def replacement_for(name: str) -> Callable[[Callable], Callable]:
    """The registry's factory for ``name``: ``original -> replacement`` calling ``original``
    wherever the kernels do not apply."""
    implementation = _IMPLEMENTATIONS[name]

    def make(original: Callable) -> Callable:
        # wraps(): PyLate's name, docstring and signature (through __wrapped__ = original).
        @functools.wraps(original)
        def replacement(*args, **kwargs):
            return implementation(original, *args, **kwargs)

        return replacement

    return make


def patch_pylate() -> bool:
    """Score PyLate's ``colbert_scores``, ``colbert_scores_pairwise`` and ``colbert_kd_scores``
    with this module's functions, in ``pylate.scores.colbert`` and every module that imported
    them (``pylate.scores``, ``pylate.rank.rank``, ``pylate.scores.similarity_functions``, and the
    evaluators and losses if imported). Imports ``pylate.scores`` and ``pylate.rank``.

    The targets go through the plugin's registry (:mod:`tilemaxsim_plaid.plaid.registry`,
    library ``"pylate"``), which ``import tilemaxsim_plaid`` does not patch on its own.
    Safe to call repeatedly. Each replacement keeps PyLate's function as ``__wrapped__`` and
    calls it wherever the kernels do not apply. A function captured by value while patched (user
    code's ``from pylate.scores import colbert_scores``, a ``Distillation`` made meanwhile)
    keeps the replacement after :func:`unpatch_pylate`; it still returns PyLate's results.

    Returns:
        True when patched; False when PyLate is missing or its version is not in
        :data:`SUPPORTED_PYLATE_VERSIONS` (a RuntimeWarning names it), and nothing changed.
    """
    if not registry.enable(libraries=_LIBRARY):
        return False
    logger.info("tilemaxsim_plaid: PyLate %s scores %s on the TileMaxSim kernels (CUDA tensors)",
                pylate_version(), ", ".join(_IMPLEMENTATIONS))
    return True


def unpatch_pylate() -> None:
    """Restore PyLate exactly as it was before :func:`patch_pylate` (idempotent)."""
    registry.disable(libraries=_LIBRARY)


def is_patched() -> bool:
    """True when every PyLate target is patched now."""
    return registry.is_enabled(None, libraries=_LIBRARY)


def active_bindings() -> dict[str, Any]:
    """``{"pylate.scores.colbert.<name>": replacement}`` for every function patched now."""
    return registry.active_bindings(libraries=_LIBRARY)
