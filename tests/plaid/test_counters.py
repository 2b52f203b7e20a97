"""What a user sees of the plugin: one INFO line when it takes over an index, and stats()."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")

import tilemaxsim_plaid  # noqa: E402
from tests.plaid.conftest import patch_state  # noqa: E402
from tilemaxsim_plaid.plaid import counters, scoring  # noqa: E402

pytestmark = pytest.mark.colbert

ALL_GROUPS = ("compat", "scoring")


def _takeover_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tilemaxsim_plaid" and r.levelno == logging.INFO]


def test_takeover_is_logged_once_per_index(tiny_searcher, tiny_query_embeddings, tiny_plaid_index,
                                           caplog, monkeypatch):
    ranker = tiny_searcher.ranker
    monkeypatch.delitem(ranker.__dict__, scoring._ANNOUNCED_ATTRIBUTE, raising=False)
    tiny_searcher.configure(ncells=1, centroid_score_threshold=0.5, ndocs=256)
    with patch_state(ALL_GROUPS), caplog.at_level(logging.INFO, logger="tilemaxsim_plaid"):
        for Q in tiny_query_embeddings[:3]:
            ranker.rank(tiny_searcher.config, Q[None])
    lines = _takeover_lines(caplog)
    assert len(lines) == 1, lines
    line = lines[0]
    C = ranker.codec.centroids.shape[0]
    for part in (tiny_plaid_index.index_path, "device cpu", "backend torch", "stage-4 products",
                 f"C={C} centroids", f"nbits={tiny_plaid_index.nbits}"):
        assert part in line, (part, line)


def test_stats_count_searches_documents_and_fallbacks(tiny_searcher, tiny_query_embeddings):
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling import colbert as modeling_colbert

    ranker = tiny_searcher.ranker
    tiny_searcher.configure(ncells=1, centroid_score_threshold=0.5, ndocs=256)
    config = tiny_searcher.config
    with patch_state(ALL_GROUPS):
        tilemaxsim_plaid.stats(reset=True)
        ranked = [ranker.rank(config, Q[None]) for Q in tiny_query_embeddings[:3]]
        reranked, _ = ranker.rank(config, tiny_query_embeddings[3][None], pids=[5, 6, 7, 8])
        scores, _ = ranker.score_pids(config, tiny_query_embeddings[4][None], torch.arange(10), None)
        Q = torch.nn.functional.normalize(torch.randn(1, 64, 32), dim=-1)
        D = torch.nn.functional.normalize(torch.randn(9, 32), dim=-1)
        modeling_colbert.colbert_score_packed(Q, D, torch.tensor([4, 5]),
                                              ColBERTConfig(interaction="flipr", query_maxlen=64))
        counts = tilemaxsim_plaid.stats()
        assert tilemaxsim_plaid.stats(reset=True) == counts
        cleared = tilemaxsim_plaid.stats()
    assert isinstance(counts, counters.PluginStats)
    assert counts.searches == 3 + 1 + 1
    assert counts.documents_scored == sum(len(pids) for pids, _ in ranked) + len(reranked) + scores.numel()
    assert len(reranked) == 4 and all(len(pids) > 0 for pids, _ in ranked)
    assert counts.fallbacks == {
        "colbert_score_packed with interaction='flipr': scored by colbert-ai's own code": 1}
    assert cleared == counters.PluginStats(0, 0, {})


def test_device_counts_are_read_when_stats_are(monkeypatch):
    """A count that stays on the device is summed at stats() (here a stand-in that says it is
    on CUDA), and folded when many are pending."""
    class OnDevice:
        is_cuda = True

        def __init__(self, value):
            self.value = value

        def __add__(self, other):
            return OnDevice(self.value + other.value)

        def __int__(self):
            return self.value

    monkeypatch.setattr(counters, "_MAX_PENDING", 3)
    counters.stats(reset=True)
    for value in range(10):
        counters.count_search(OnDevice(value))
    assert len(counters._pending_documents) <= 4
    assert counters.stats(reset=True) == counters.PluginStats(10, 45, {})
