"""The plugin's record_function ranges per PLAID stage: present in a torch.profiler trace of a
search on the tiny index, absent (not even opened) when no profiler records."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")

from tests.plaid.conftest import patch_state  # noqa: E402
from tilemaxsim_plaid.plaid import graphs, scoring  # noqa: E402

pytestmark = pytest.mark.colbert

ALL_GROUPS = ("compat", "scoring")
EAGER_SEARCH = {scoring.CENTROID_SCORES, scoring.CANDIDATES, scoring.CENTROID_INTERACTION,
                scoring.EXACT_SCORES, scoring.SORT, scoring.TRANSFER}


@pytest.fixture(autouse=True)
def eager_search(monkeypatch):
    """Searches run stage by stage (on a GPU they would replay a CUDA graph)."""
    monkeypatch.setenv(graphs.GRAPHS_ENV_VAR, "0")


def _range_names(prof) -> list[str]:
    return [event.name for event in prof.events() if event.name.startswith("tilemaxsim.")]


def _configured(searcher):
    # Searcher.dense_search's knobs for k = 10: every stage runs, over the fewest candidates
    # (the interpreter's stage 4 costs one program per candidate).
    searcher.configure(**scoring.dense_search_knobs(10))
    return searcher.config


def test_ranges_are_named_in_one_tuple():
    assert len(set(scoring.PROFILER_RANGES)) == len(scoring.PROFILER_RANGES)
    assert all(name.startswith("tilemaxsim.") for name in scoring.PROFILER_RANGES)
    assert EAGER_SEARCH | {scoring.SEARCH_GRAPH} == set(scoring.PROFILER_RANGES)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", id="triton-interpreted")])
def test_search_records_every_stage(tiny_searcher, tiny_query_embeddings, backend, monkeypatch):
    monkeypatch.setenv("TILEMAXSIM_PLAID_BACKEND", backend)
    ranker, config = tiny_searcher.ranker, _configured(tiny_searcher)
    Q = tiny_query_embeddings[0][None]
    with patch_state(ALL_GROUPS):
        unprofiled = ranker.rank(config, Q)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            profiled = ranker.rank(config, Q)
    assert profiled == unprofiled, "a profiled search ranks as an unprofiled one"
    names = _range_names(prof)
    assert set(names) == EAGER_SEARCH, names
    # One range per stage, in pipeline order (each range's event is listed as it opens).
    assert names == [n for n in scoring.PROFILER_RANGES if n in EAGER_SEARCH], names


def test_rerank_and_score_pids_record_stage_4(tiny_searcher, tiny_query_embeddings):
    ranker, config = tiny_searcher.ranker, _configured(tiny_searcher)
    Q = tiny_query_embeddings[1][None]
    with patch_state(ALL_GROUPS), profile(activities=[ProfilerActivity.CPU]) as prof:
        ranker.rank(config, Q, pids=[3, 1, 4, 1, 5])
        ranker.score_pids(config, Q, torch.arange(20), None)
    assert _range_names(prof) == [scoring.EXACT_SCORES, scoring.SORT, scoring.TRANSFER,
                                  scoring.EXACT_SCORES]


def test_search_all_records_each_query(tiny_searcher, tiny_plaid_index):
    queries = dict(enumerate(tiny_plaid_index.queries[:2]))
    with patch_state(ALL_GROUPS):
        expected = tiny_searcher.search_all(queries, k=5).todict()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            ranking = tiny_searcher.search_all(queries, k=5)
    assert ranking.todict() == expected
    names = _range_names(prof)
    assert {name: names.count(name) for name in set(names)} == {name: 2 for name in EAGER_SEARCH}


def test_graph_replay_is_one_range(tiny_searcher, tiny_query_embeddings, monkeypatch):
    """A CUDA-graph search records its replay as one range (capture needs a GPU: the stand-in
    "replays" by running the pipeline again)."""

    class EagerCapture:
        def __init__(self, index, config, num_query_tokens, pipeline):
            self.index, self.config, self.pipeline = index, config, pipeline
            self.pipeline(index, config, torch.zeros(num_query_tokens, index.dim))  # "capture"

        def __call__(self, Q, copy=True):
            return self.pipeline(self.index, self.config, Q.float())

    monkeypatch.setattr(graphs, "_CapturedSearch", EagerCapture)
    monkeypatch.setattr(scoring.graphs, "capturable", lambda index: True)
    ranker, config = tiny_searcher.ranker, _configured(tiny_searcher)
    monkeypatch.delitem(ranker.__dict__, graphs._CACHE_ATTRIBUTE, raising=False)
    Q = tiny_query_embeddings[2][None]
    with patch_state(ALL_GROUPS):
        ranker.rank(config, Q)  # captures
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            ranker.rank(config, Q)
    replays = [e for e in prof.events() if e.name == scoring.SEARCH_GRAPH]
    assert len(replays) == 1
    assert scoring.TRANSFER in _range_names(prof)
    monkeypatch.delitem(ranker.__dict__, graphs._CACHE_ATTRIBUTE, raising=False)


def test_no_range_is_opened_without_a_profiler(tiny_searcher, tiny_query_embeddings, monkeypatch):
    opened = []
    real = torch.profiler.record_function
    monkeypatch.setattr(torch.profiler, "record_function",
                        lambda name, *args: opened.append(name) or real(name, *args))
    ranker, config = tiny_searcher.ranker, _configured(tiny_searcher)
    with patch_state(ALL_GROUPS):
        ranker.rank(config, tiny_query_embeddings[3][None])
        assert opened == []
        with profile(activities=[ProfilerActivity.CPU]):
            ranker.rank(config, tiny_query_embeddings[3][None])
    assert set(opened) == EAGER_SEARCH


def test_stage_range_is_a_no_op_without_a_profiler():
    with scoring.stage_range(scoring.SORT) as entered:
        assert entered is None
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with scoring.stage_range(scoring.SORT):
            torch.ones(2).sum()
    assert _range_names(prof) == [scoring.SORT]
