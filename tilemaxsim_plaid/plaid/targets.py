"""Every colbert-ai 0.2.22 binding the plugin changes, in one list.

Each entry is a :class:`~tilemaxsim_plaid.plaid.patch_target.PatchTarget`; the registry applies
and reverts them, and patches/README.md lists the same sites. Extension stand-ins are set
together with the class's ``loaded_extensions`` flag: colbert-ai's lazy loaders skip
compiling only when that flag exists, and would otherwise overwrite the stand-ins.
"""

from __future__ import annotations

import functools

from tilemaxsim_plaid.plaid import encoder_graphs, extensions, query_tokens, scoring, transformers_compat
from tilemaxsim_plaid.plaid.patch_target import PatchTarget

__all__ = ["TARGETS"]


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
