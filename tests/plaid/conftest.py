"""Fixtures for the colbert-ai integration tests: a Searcher over the tiny index, and helpers
that put colbert-ai in a known patch state and restore the session's state afterwards."""

from __future__ import annotations

import concurrent.futures
import contextlib

import pytest
import torch


@contextlib.contextmanager
def patch_state(groups):
    """Exactly ``groups`` patched inside the block; the previous state is restored after."""
    from tilemaxsim_plaid.plaid import registry

    before = set(registry.active_bindings())
    registry.disable()
    if groups:
        assert registry.enable(groups)
    try:
        yield
    finally:
        registry.disable()
        wanted = {t.group for t in registry._select(None) if t.name in before}
        if wanted:
            registry.enable(sorted(wanted))
        assert set(registry.active_bindings()) == before


@contextlib.contextmanager
def stock_colbert():
    """Unpatched colbert-ai with its real compiled C++ extensions (loaded from the
    TORCH_EXTENSIONS_DIR cache, or compiled once per run: ~40 s of one core each)."""
    from colbert.modeling.colbert import ColBERT
    from colbert.search.index_storage import IndexScorer
    from colbert.search.strided_tensor import StridedTensor

    with patch_state(()):
        # The owners' builds are independent ninja runs (a lock per extension), so they compile
        # side by side: the wait is IndexScorer's two builds, not all four in a row.
        owners = (IndexScorer, ColBERT, StridedTensor)
        with concurrent.futures.ThreadPoolExecutor(len(owners)) as pool:
            for loaded in [pool.submit(owner.try_load_torch_extensions, False) for owner in owners]:
                loaded.result()
        yield


@pytest.fixture(scope="session")
def tiny_searcher(tiny_plaid_index):
    """A colbert-ai Searcher over the tiny index (CPU); its patch state is whatever is active."""
    from colbert import Searcher
    from colbert.infra import Run, RunConfig

    with patch_state(("compat",)), Run().context(RunConfig(nranks=1, avoid_fork_if_possible=True)):
        searcher = Searcher(
            index=tiny_plaid_index.index_name,
            index_root=tiny_plaid_index.index_root,
            checkpoint=tiny_plaid_index.checkpoint_path,
            verbose=0,
        )
    return searcher


@pytest.fixture(scope="session")
def tiny_query_embeddings(tiny_searcher, tiny_plaid_index):
    """[Nq, 32, dim] fp32 query embeddings of the first 24 queries (encoding is the slow part)."""
    with patch_state(("compat",)):
        return tiny_searcher.encode(tiny_plaid_index.queries[:24]).to(torch.float32)
