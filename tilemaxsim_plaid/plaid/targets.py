"""Every binding the plugin changes, one tuple per library.

:data:`TARGETS`: colbert-ai 0.2.22 (patches/README.md lists the same sites);
:data:`RAGATOUILLE_TARGETS`: RAGatouille 0.0.9's rerank scoring; :data:`PYLATE_TARGETS`: PyLate
1.6.0's scoring functions (patched on request, :func:`tilemaxsim_plaid.pylate.patch_pylate`).
Each entry is a :class:`~tilemaxsim_plaid.plaid.patch_target.PatchTarget`; the registry
(:data:`tilemaxsim_plaid.plaid.registry.LIBRARIES`) applies and reverts them.

Extension stand-ins are set together with the class's ``loaded_extensions`` flag: colbert-ai's
lazy loaders skip compiling only when that flag exists, and would otherwise overwrite them.
"""

from __future__ import annotations

import dataclasses
import functools

from tilemaxsim_plaid import pylate, ragatouille
from tilemaxsim_plaid.plaid import encoder_graphs, extensions, query_tokens, scoring, transformers_compat
from tilemaxsim_plaid.plaid.patch_target import PatchTarget

__all__ = ["TARGETS", "RAGATOUILLE_TARGETS", "PYLATE_TARGETS", "FunctionTarget"]


def _constant(value):
    return lambda original: value


def _static(function):
    """A staticmethod around ``function`` that records the original attribute as __wrapped__.

    staticmethod, because colbert-ai stores the compiled function on the class and calls it
    as ``Class.fn(...)``: a plain function would also bind as a method on instances.
    """

    def make(original):
        @functools.wraps(function)
        def stand_in(*args, **kwargs):
            return function(*args, **kwargs)

        stand_in.__wrapped__ = original
        return staticmethod(stand_in)

    return make


def _method(function):
    """Bind ``function(original, self, ...)`` as a method; ``__wrapped__`` is the original."""

    def make(original):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            return function(original, self, *args, **kwargs)

        method.__wrapped__ = original
        return method

    return make


def _wrap(function):
    """A module-level function replaced by ``function(original)``'s result."""

    def make(original):
        replacement = function(original)
        replacement.__wrapped__ = original
        return replacement

    return make


_RESIDUAL_CODEC = "colbert.indexing.codecs.residual:ResidualCodec"
_INDEX_SCORER = "colbert.search.index_storage:IndexScorer"
_STRIDED_TENSOR = "colbert.search.strided_tensor:StridedTensor"
_COLBERT = "colbert.modeling.colbert:ColBERT"

_EXTENSION_TARGETS = (
    PatchTarget(_RESIDUAL_CODEC, "decompress_residuals", _static(extensions.decompress_residuals_gpu),
                "compat", why="CUDA extension decompress_residuals.cu: needs nvcc, allocates on cuda:0"),
    PatchTarget(_RESIDUAL_CODEC, "packbits", _static(extensions.packbits_gpu),
                "compat", why="CUDA extension packbits.cu: needs nvcc"),
    PatchTarget(_RESIDUAL_CODEC, "loaded_extensions", _constant(True),
                "compat", why="stops ResidualCodec.try_load_torch_extensions from compiling"),
    PatchTarget(_INDEX_SCORER, "filter_pids", _static(extensions.filter_pids_cpu),
                "compat", why="C++ extension filter_pids.cpp (CPU stages 2-3): needs a compiler"),
    PatchTarget(_INDEX_SCORER, "decompress_residuals", _static(extensions.decompress_residuals_cpu),
                "compat", why="C++ extension decompress_residuals.cpp (CPU stage 4): needs a compiler"),
    PatchTarget(_INDEX_SCORER, "loaded_extensions", _constant(True),
                "compat", why="stops IndexScorer.try_load_torch_extensions from compiling"),
    PatchTarget(_STRIDED_TENSOR, "segmented_lookup", _static(extensions.segmented_lookup),
                "compat", why="C++ extension segmented_lookup.cpp (CPU IVF/codes lookup)"),
    PatchTarget(_STRIDED_TENSOR, "loaded_extensions", _constant(True),
                "compat", why="stops StridedTensor.try_load_torch_extensions from compiling"),
    PatchTarget(_COLBERT, "segmented_maxsim", _static(extensions.segmented_maxsim),
                "compat", why="C++ extension segmented_maxsim.cpp (CPU colbert_score_packed)"),
    PatchTarget(_COLBERT, "loaded_extensions", _constant(True),
                "compat", why="stops ColBERT.try_load_torch_extensions from compiling"),
)

_TRANSFORMERS_TARGETS = (
    PatchTarget("colbert.modeling.hf_colbert", "class_factory",
                _wrap(transformers_compat.class_factory_with_post_init), "compat",
                also_bound_in=(
                    "colbert.modeling.base_colbert",
                    "colbert.modeling.tokenization.query_tokenization",
                    "colbert.modeling.tokenization.doc_tokenization",
                ),
                why="HF_ColBERT.__init__ never calls post_init(): transformers 5 cannot load it"),
)

_SCORING_TARGETS = (
    PatchTarget(_INDEX_SCORER, "rank", _method(scoring.rank), "scoring",
                why="device-resident candidate generation, fused stages 2-4, one host sync"),
    PatchTarget(_INDEX_SCORER, "score_pids", _method(scoring.score_pids), "scoring",
                why="stages 2-4 on our kernels with PLAID's ncells/threshold/ndocs semantics"),
    PatchTarget("colbert.searcher:Searcher", "_search_all_Q", _method(scoring.search_all_Q),
                "scoring", why="search_all scored many queries per launch (upstream: one by one)"),
    PatchTarget("colbert.modeling.colbert", "colbert_score_packed",
                _wrap(scoring.colbert_score_packed_exact), "scoring",
                also_bound_in=("colbert.search.index_storage",),
                why="exact fp32 MaxSim (upstream: fp16 on GPU, negative maxima floored to 0 on CPU)"),
    PatchTarget("colbert.modeling.checkpoint:Checkpoint", "query", _method(encoder_graphs.query),
                "scoring", why="query encoder as a CUDA graph, bit-identical to the eager one "
                               "(upstream: hundreds of launches and a host sync per query)"),
    PatchTarget("colbert.modeling.tokenization.query_tokenization:QueryTokenizer", "tensorize",
                _method(query_tokens.tensorize), "scoring",
                why="query tokens built on the host and uploaded once, checked equal to upstream's "
                    "(upstream: three synchronous uploads and ten launches per query)"),
)

TARGETS = _EXTENSION_TARGETS + _TRANSFORMERS_TARGETS + _SCORING_TARGETS


@dataclasses.dataclass(frozen=True)
class FunctionTarget(PatchTarget):
    """A function that other modules of its package import by value, some of them optionally.

    Attributes (besides :class:`PatchTarget`'s):
        bound_if_imported: modules that did ``from ... import <attribute>`` but are heavy to
            import (PyLate's evaluators and losses import sentence-transformers): patched if
            imported; one imported while patched holds the replacement, and is given the
            original back when the target is reverted.
        default_of: ``(module, "Class.method", parameter)`` whose default argument is the
            function, captured when the class is defined. Not patched (the only one is a
            training loss, which needs PyLate's autograd path anyway), but restored on revert
            if the module was imported while patched.
    """

    bound_if_imported: tuple[str, ...] = ()
    default_of: tuple[tuple[str, str, str], ...] = ()


# RAGatouille 0.0.9: the one scoring function of rerank() and search_encoded_docs().
RAGATOUILLE_TARGETS = (
    PatchTarget("ragatouille.models.colbert:ColBERT", "_colbert_score",
                _method(ragatouille.colbert_score), "scoring", why="RAGatouille's in-memory rerank scoring (upstream: a padded batched "
                               "matmul, fp16 on GPU), same semantics on the dense kernel"),
)

_PYLATE_WHY = "PyLate's ColBERT scoring on the dense kernel, PyLate's torch-path semantics"
# PyLate 1.6.0: the three functions of pylate.scores.colbert and every module importing them.
PYLATE_TARGETS = (
    FunctionTarget("pylate.scores.colbert", "colbert_scores",
                   pylate.replacement_for("colbert_scores"), "scoring",
                   also_bound_in=("pylate.scores", "pylate.scores.similarity_functions",
                                  "pylate.rank.rank"),
                   why=_PYLATE_WHY),
    FunctionTarget("pylate.scores.colbert", "colbert_scores_pairwise",
                   pylate.replacement_for("colbert_scores_pairwise"), "scoring",
                   also_bound_in=("pylate.scores", "pylate.scores.similarity_functions"),
                   bound_if_imported=("pylate.evaluation.colbert_triplet",), why=_PYLATE_WHY),
    FunctionTarget("pylate.scores.colbert", "colbert_kd_scores",
                   pylate.replacement_for("colbert_kd_scores"), "scoring", also_bound_in=("pylate.scores",),
                   bound_if_imported=("pylate.evaluation.colbert_distillation",
                                      "pylate.losses.distillation"),
                   default_of=(("pylate.losses.distillation", "Distillation.__init__",
                                "score_metric"),),
                   why=_PYLATE_WHY),
)
