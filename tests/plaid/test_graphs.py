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
    index = types.SimpleNamespace(source_key=("index", 1), inv_norms=None, bucket_weights_in_fp16=False)
    config = types.SimpleNamespace(ncells=1, centroid_score_threshold=0.5, ndocs=256, query_maxlen=32)
    Q = torch.zeros(32, 8)

    def pipeline(index_, config_, Q_):
        return "eager result"

    assert graphs.replay(scorer, index, config, Q, pipeline) == "eager result"
    assert graphs.replay(scorer, index, config, Q, pipeline) == "eager result"
    assert len(attempts) == 1, "a key whose capture failed is not captured again"
    assert "CUDA graph capture failed" in caplog.text
    # A new index copy drops the old keys (and their graphs).
    index2 = types.SimpleNamespace(source_key=("index", 2), inv_norms=None, bucket_weights_in_fp16=False)
    graphs.replay(scorer, index2, config, Q, pipeline)
    assert all(key[0] == ("index", 2) for key in vars(scorer)[graphs._CACHE_ATTRIBUTE])
