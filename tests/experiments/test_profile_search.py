"""experiments/profile_search: the random index it profiles is a well-formed PLAID index."""

from __future__ import annotations

import pytest
import torch

from experiments import profile_search
from tilemaxsim_plaid.codecs.residual import residual_inverse_norms
from tilemaxsim_plaid.plaid import scoring


@pytest.fixture(scope="module")
def index():
    return profile_search.synthetic_device_index(700, 64, 0.8, torch.device("cpu"), seed=3)


def test_inverted_lists_hold_exactly_the_passages_that_contain_each_centroid(index):
    offsets, codes = index.offsets.tolist(), index.codes
    expected = [set() for _ in range(index.centroids.shape[0])]
    for pid in range(index.num_docs):
        for code in codes[offsets[pid]:offsets[pid + 1]].tolist():
            expected[code].add(pid)
    ivf_offsets = index.ivf_offsets.tolist()
    for cell, members in enumerate(expected):
        listed = index.ivf_pids[ivf_offsets[cell]:ivf_offsets[cell + 1]].tolist()
        assert listed == sorted(members)
    assert index.ivf_lengths.tolist() == [len(m) for m in expected]
    assert index.max_ivf_length == max(len(m) for m in expected)
    assert int(index.ivf_lengths_desc_cumsum[-1]) == index.ivf_pids.numel()


def test_lengths_codes_and_norms_are_those_of_a_residual_index(index):
    assert int(index.doclens.min()) >= 4 and int(index.doclens.max()) <= 180
    assert index.num_tokens == int(index.doclens.sum()) == index.codes.numel()
    # About one distinct centroid per 3.4 tokens, as MS MARCO's IVF has: far fewer pairs than tokens.
    assert index.ivf_pids.numel() < 0.5 * index.num_tokens
    expected = residual_inverse_norms(index.codes, index.residuals, index.centroids,
                                      index.bucket_weights, index.nbits)
    assert torch.equal(index.inv_norms, expected)
    assert torch.equal(index.centroids_half.float(), index.centroids)
    # Zipf popularity: the largest list is several times the mean one.
    assert index.max_ivf_length > 3 * index.ivf_lengths.float().mean()


def test_queries_are_normalised_and_come_from_passages(index):
    Q = profile_search.query_batch(index, 5)
    assert Q.shape == (5, profile_search.QUERY_LEN, index.dim)
    assert torch.allclose(Q.norm(dim=-1), torch.ones(5, profile_search.QUERY_LEN), atol=1e-5)


def test_refuses_to_run_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit) as exit_info:
        profile_search.main(["--passages", "100"])
    assert exit_info.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_stage_2_and_table_comparisons_run_the_ops_they_time(monkeypatch):
    """The A/B parts of a profile, with the graph timer replaced by one call of what it times:
    stage 2 per slot and used-only, and both table builds, run on the Triton ops (interpreted)."""
    import types

    calls = []
    monkeypatch.setattr(profile_search, "graph_replay_ms", lambda fn: calls.append(fn()) or 0.001)
    monkeypatch.setenv("TILEMAXSIM_PLAID_BACKEND", "triton")
    # Few passages per list: the interpreter runs one program per slot of the per-slot launch.
    index = profile_search.synthetic_device_index(150, 512, 0.8, torch.device("cpu"), seed=5)
    Q = profile_search.query_batch(index, 1)[0]
    config = types.SimpleNamespace(query_maxlen=profile_search.QUERY_LEN, **scoring.dense_search_knobs(10))
    with torch.inference_mode():
        stage_2 = profile_search._stage_2_ab(index, config, Q)
        tables = profile_search.table_builds_us(index, Q)
        probe = profile_search.probe_us(index, config, Q)
    assert set(stage_2) == {"per_slot", "used_only"}
    assert set(tables) == {"cublas_fp32", "cublas_fp32_probe", "split_fp16", "split_fp16_probe"}
    assert set(probe) == {"torch_two_passes", "fused"}
    per_slot, used_only, cublas, cublas_probe, (split, _, _), split_probe, two_passes, fused = calls
    assert torch.equal(split_probe[0], split) and torch.equal(split_probe[4], (split.max(-1).values >= 0.5))
    assert torch.equal(cublas_probe[0], cublas.argmax(0))
    assert torch.equal(per_slot, used_only), "the two stage-2 launches score alike"
    assert torch.allclose(split, cublas, rtol=0, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(two_passes, fused)), "cells and mask alike"
