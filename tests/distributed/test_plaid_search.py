"""The one-import plugin searching a PLAID index sharded over two gloo ranks."""

import pytest
import torch

from tests.distributed.helpers import run_on_two_ranks

pytestmark = pytest.mark.colbert

SEARCH_KNOBS = dict(ncells=2, centroid_score_threshold=0.45, ndocs=1024, query_maxlen=32)
# Scores of the two paths differ only in fp32 summation order.
SCORE_ATOL = 1e-4


def _rank_all(scorer, Q, rerank_pids):
    from colbert.infra import ColBERTConfig

    config = ColBERTConfig(**SEARCH_KNOBS)
    searches = [scorer.rank(config, Q[i:i + 1]) for i in range(Q.shape[0])]
    rerank = scorer.rank(config, Q[:1], pids=rerank_pids)
    return searches, rerank


def _assert_same_ranking(got, expected):
    got_pids, got_scores = got
    exp_pids, exp_scores = expected
    assert sorted(got_pids) == sorted(exp_pids)
    by_pid = dict(zip(exp_pids, exp_scores))
    for pid, score in zip(got_pids, got_scores):
        assert abs(score - by_pid[pid]) <= SCORE_ATOL
    # Same order up to ties: wherever the expected scores are not within rounding of each other,
    # the same documents come before that point.
    for i in range(len(exp_pids) - 1):
        if exp_scores[i] - exp_scores[i + 1] > SCORE_ATOL:
            assert sorted(got_pids[: i + 1]) == sorted(exp_pids[: i + 1])


def _sharded_scenario(index_path, inputs_path):
    import tilemaxsim_plaid  # noqa: F401  (patches colbert-ai)
    from colbert.search.index_storage import IndexScorer

    from tilemaxsim_plaid.distributed import default_scorer, shard_index_scorer

    data = torch.load(inputs_path)
    scorer = IndexScorer(index_path, use_gpu=False, load_index_with_mmap=False)
    sharded = shard_index_scorer(scorer, scorer_fn=default_scorer("residual", "reference"))
    assert sharded.num_docs == data["num_docs"]
    shard = sharded.shard
    assert 0 < shard.pid_stop - shard.pid_start < data["num_docs"]  # this rank holds part of it
    calls = []
    score = sharded.score
    sharded.score = lambda *args, **kwargs: calls.append(1) or score(*args, **kwargs)
    searches, rerank = _rank_all(scorer, data["Q"], data["rerank_pids"])
    assert len(calls) == len(searches) + 1  # every exact stage went through the shards
    from tilemaxsim_plaid.plaid.device_index import device_index

    assert device_index(scorer).residuals.shape[0] == 0  # residuals only in the shards
    for got, expected in zip(searches, data["searches"]):
        _assert_same_ranking(got, expected)
    _assert_same_ranking(rerank, data["rerank"])


def test_plugin_searches_an_index_sharded_over_two_ranks(tiny_plaid_index, tmp_path):
    import tilemaxsim_plaid
    from colbert.search.index_storage import IndexScorer

    scorer = IndexScorer(tiny_plaid_index.index_path, use_gpu=False, load_index_with_mmap=False)
    num_docs = len(scorer.doclens)
    g = torch.Generator().manual_seed(7)
    Q = torch.nn.functional.normalize(torch.randn(3, 32, tiny_plaid_index.dim, generator=g), dim=-1)
    rerank_pids = list(range(0, num_docs, 3))
    with tilemaxsim_plaid.enabled():  # whatever earlier tests left patched
        searches, rerank = _rank_all(scorer, Q, rerank_pids)
    assert all(len(pids) > 0 for pids, _ in searches)
    inputs = tmp_path / "inputs.pt"
    torch.save({"Q": Q, "rerank_pids": rerank_pids, "searches": searches, "rerank": rerank,
                "num_docs": num_docs}, inputs)
    run_on_two_ranks(tmp_path, _sharded_scenario, tiny_plaid_index.index_path, str(inputs))
