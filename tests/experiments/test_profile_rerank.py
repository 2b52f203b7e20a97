"""The rerank profile's random DeviceIndex is a valid index: stage 4 on it equals the float64
reference of residual MaxSim."""

import dataclasses

import pytest
import torch

from experiments.profile_rerank import DIM, NBITS, QUERY_LEN, random_device_index
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.plaid import backends


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_random_device_index_scores_like_the_reference(monkeypatch, backend):
    """triton: the fused residual kernel (in the interpreter), the path the profile times."""
    monkeypatch.setenv(backends.BACKEND_ENV_VAR, backend)
    monkeypatch.setattr("experiments.profile_rerank.NUM_CENTROIDS", 64)
    index = random_device_index(40, torch.device("cpu"))
    assert index.bucket_weights_in_fp16
    Q = torch.nn.functional.normalize(torch.randn(QUERY_LEN, DIM), dim=-1)
    pids = torch.tensor([7, 0, 39, 7, 12])
    got = backends.exact_scores(index, Q, pids)
    want = reference.maxsim_residual(Q, index.codes, index.residuals, index.offsets,
                                     index.centroids, index.bucket_weights, NBITS, pids)
    assert_close(got, want, "maxsim_residual_split" if backend == "triton" else "maxsim_residual",
                 torch.float32)
    # The table from the fp16 centroids (one launch, with the query halves) or from fp32 ones.
    without_half = backends.exact_scores(dataclasses.replace(index, centroids_half=None), Q, pids)
    assert_close(got, without_half, "maxsim_residual_split", torch.float32)
