"""The switches of the plugin's CUDA-graph search path (capture itself needs a GPU: the GPU
benchmark checks that replays give exactly the eager lists, experiments/bench_plaid.py)."""

import types

import pytest
import torch

from tilemaxsim_plaid.plaid import graphs


@pytest.fixture
def cuda_index(monkeypatch):
    """An index that claims to live on a GPU, and a torch that says nothing is being captured."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv(graphs.GRAPHS_ENV_VAR, raising=False)
    monkeypatch.delenv("TILEMAXSIM_PLAID_BACKEND", raising=False)
    return types.SimpleNamespace(device=torch.device("cuda", 0))


def test_graphs_only_for_gpu_indexes_on_the_triton_backend(cuda_index, monkeypatch):
    assert graphs.capturable(cuda_index)
    assert not graphs.capturable(types.SimpleNamespace(device=torch.device("cpu")))
    monkeypatch.setenv("TILEMAXSIM_PLAID_BACKEND", "torch")
    assert not graphs.capturable(cuda_index)


def test_environment_variable_and_block_turn_graphs_off(cuda_index, monkeypatch):
    with graphs.disabled():
        with graphs.disabled():
            assert not graphs.capturable(cuda_index)
        assert not graphs.capturable(cuda_index), "the outer block still holds"
    assert graphs.capturable(cuda_index)
    monkeypatch.setenv(graphs.GRAPHS_ENV_VAR, "0")
    assert not graphs.capturable(cuda_index)


def test_no_graph_inside_a_capture(cuda_index, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not graphs.capturable(cuda_index)


def test_failed_capture_falls_back_to_eager_once(monkeypatch, caplog):
    attempts = []

    class Failing:
        def __init__(self, *args):
            attempts.append(args)
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_CapturedSearch", Failing)
    scorer = types.SimpleNamespace()
    index = types.SimpleNamespace(source_key=("index", 1), inv_norms=None, bucket_weights_in_fp16=False,
                                  device=torch.device("cpu"))
    config = types.SimpleNamespace(ncells=1, centroid_score_threshold=0.5, ndocs=256, query_maxlen=32)
    Q = torch.zeros(32, 8, dtype=torch.float16)

    def pipeline(index_, config_, Q_):
        assert Q_.dtype == torch.float32, "the eager pipeline gets the fp32 query a graph's copy makes"
        return "eager result"

    assert graphs.replay(scorer, index, config, Q, pipeline) == "eager result"
    assert graphs.replay(scorer, index, config, Q, pipeline) == "eager result"
    assert len(attempts) == 1, "a key whose capture failed is not captured again"
    assert "CUDA graph capture failed" in caplog.text
    # A new index copy drops the old keys (and their graphs).
    index2 = types.SimpleNamespace(source_key=("index", 2), inv_norms=None, bucket_weights_in_fp16=False,
                                   device=torch.device("cpu"))
    graphs.replay(scorer, index2, config, Q, pipeline)
    assert all(key[0] == ("index", 2) for key in vars(scorer)[graphs._CACHE_ATTRIBUTE])


def test_one_query_reads_the_graphs_output_and_a_batch_keeps_copies(tiny_searcher, tiny_query_embeddings,
                                                                   monkeypatch):
    """rank() transfers its list before the next replay, so it takes the graph's own output
    (copy=False); search_all_Q holds many lists before one transfer, so each is a copy. Both
    hand the query over uncast: the graph's input copy casts it to fp32."""
    from tests.plaid.conftest import patch_state
    from tilemaxsim_plaid.plaid import scoring
    from tilemaxsim_plaid.plaid.device_index import device_index

    calls = []
    real_pipeline = scoring._search_pipeline

    def recording_replay(scorer, index, config, Q, pipeline, copy=True):
        calls.append((copy, Q.dtype))
        return pipeline(index, config, Q.to(torch.float32))

    monkeypatch.setattr(scoring.graphs, "capturable", lambda index: True)
    monkeypatch.setattr(scoring.graphs, "replay", recording_replay)
    Q = tiny_query_embeddings[:2].half()
    with patch_state(("compat", "scoring")):
        tiny_searcher.configure(ncells=2, centroid_score_threshold=0.4, ndocs=256)
        pids, _ = tiny_searcher.ranker.rank(tiny_searcher.config, Q[:1])
        assert calls == [(False, torch.float16)]
        from colbert.data import Queries

        tiny_searcher._search_all_Q(Queries(data={0: "a", 1: "b"}), Q, 10)
    assert calls[1:] == [(True, torch.float16), (True, torch.float16)]
    with torch.inference_mode():
        eager = real_pipeline(device_index(tiny_searcher.ranker), tiny_searcher.config,
                              Q[0].float()).to_lists()[0]
    assert pids == eager
