"""The residual-scoring floors (experiments/residual_floors.py) must do all the work they claim
(every byte read, every S row gathered, every word decoded): each is checked against float64
torch on a random residual index, with empty and multi-tile documents."""

from __future__ import annotations

import pytest
import torch

from experiments import bench_compressed
from experiments.residual_floors import CONFIGS, STAGES, expected_floor, residual_floor
from tilemaxsim_plaid.ops.residual import query_centroid_scores


@pytest.fixture
def index(device):
    index = bench_compressed.make_index(9, 64, 128, 2, device, seed=int(torch.randint(0, 1000, ())))
    # Empty and multi-tile documents next to the MS MARCO-like ones.
    lengths = torch.tensor([0, 1, 70, 31, 33, 0, 96, 5, 12], device=device)
    offsets = torch.zeros(10, dtype=torch.int64, device=device)
    offsets[1:] = lengths.cumsum(0)
    index["offsets"] = offsets
    Q = bench_compressed.queries(1, 32, 128, device)
    index["scores"] = query_centroid_scores(Q, index["centroids"])
    return index


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("block_t,num_warps", [CONFIGS[0], CONFIGS[-1]])
def test_floor_equals_its_torch_definition(stage, block_t, num_warps, index):
    args = (index["codes"], index["residuals"], index["inv_norms"], index["offsets"], index["scores"],
            index["bucket_weights"], 2)
    got = residual_floor(stage, *args, block_t=block_t, num_warps=num_warps)
    torch.testing.assert_close(got.double().cpu(), expected_floor(stage, *args).cpu(), rtol=1e-5, atol=1e-3)


def test_stages_differ(index):
    """Each stage adds its own term (the test above would pass vacuously if they did not)."""
    args = (index["codes"], index["residuals"], index["inv_norms"], index["offsets"], index["scores"],
            index["bucket_weights"], 2)
    read, gather, decode = (expected_floor(stage, *args) for stage in STAGES)
    assert not torch.equal(read, gather) and not torch.equal(gather, decode)


def test_rejects_unknown_stage_and_wide_d(index, device):
    args = (index["codes"], index["residuals"], index["inv_norms"], index["offsets"], index["scores"],
            index["bucket_weights"], 2)
    with pytest.raises(ValueError, match="stage must be one of"):
        residual_floor("products", *args)
    wide = torch.zeros(index["residuals"].shape[0], 96, dtype=torch.uint8, device=device)  # d = 384
    with pytest.raises(ValueError, match="power of two <= 128"):
        residual_floor("read", index["codes"], wide, *args[2:])


def test_bench_rows(index, device):
    """bench_compressed's floor rows: one per stage, each checked inside, in stage order."""
    rows = bench_compressed.floor_rows("tiny", bench_compressed.queries(1, 32, 128, device), index,
                                       nbytes=1000, num_docs=9, ceilings={"read_gbps": 4000.0},
                                       time_ms=bench_compressed._timer(torch.device("cpu")))
    assert [r["provider"] for r in rows] == [f"floor_{stage}" for stage in STAGES]
    assert all(r["ms"] > 0 and r["config"].startswith("block_t=") for r in rows)
