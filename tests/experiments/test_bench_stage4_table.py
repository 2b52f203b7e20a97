"""bench_stage4_table's two calls: the op's default (one query's table whole) and the rule
before it (the table split by query rows, or centroid rows gathered), both exact (timing needs a
GPU)."""

import pytest
import torch
import torch.nn.functional as F

from experiments.bench_compressed import make_index
from experiments.bench_stage4_table import USER_MODES, budget_rule, stage4_calls
from tilemaxsim_plaid.ops import residual
from tilemaxsim_plaid.reference import maxsim_residual as reference

C, DIM, NBITS = 64, 32, 2


def _recorded(monkeypatch):
    """(query rows, a table passed, split_query, whole-table rule on) of every launch."""
    seen = []
    real = residual._launch_kernel
    monkeypatch.setattr(residual, "_launch_kernel", lambda Q3, *a, **k: seen.append(
        (Q3.shape[1], a[-2] is not None, a[-1], residual.WHOLE_TABLE_ROWS > 0))
        or real(Q3, *a, **k))
    return seen


@pytest.mark.parametrize("mode", ["search", "rerank", "fp16", "bf16", "fp32"])
@pytest.mark.parametrize("rows_in_budget,split_launches", [
    pytest.param(16, [16, 16], id="two-tiles"),
    pytest.param(8, [32], id="no-tile-fits"),
])
def test_split_and_default_score_as_the_reference(device, monkeypatch, mode, rows_in_budget,
                                                  split_launches):
    index = make_index(40, C, DIM, NBITS, device)
    Q = F.normalize(torch.randn(32, DIM, generator=torch.Generator().manual_seed(3)),
                    dim=-1).to(device)
    element = 2 if mode == "fp16" else 4
    user = mode in USER_MODES
    monkeypatch.setattr(residual, "MAX_CENTROID_TABLE_BYTES", C * rows_in_budget * element)
    seen = _recorded(monkeypatch)
    pids = torch.tensor([0, 3, 7, 8, 20, 39], device=device)
    calls = stage4_calls(index, Q, mode, pids)
    split, default = calls["split"](), calls["default"]()
    assert residual.WHOLE_TABLE_ROWS == 64  # restored
    assert sorted(calls) == (["default", "gather", "split"] if user else ["default", "split"])
    plugin = not user
    gathers = rows_in_budget < residual.MIN_TABLE_TILE_ROWS
    # The split launches: each tile a table (the caller's copied out in a search), or the
    # gathered call (fp32 products without split_query in the plugin's modes).
    assert [n for n, *_ in seen[:-1]] == split_launches
    assert all(not whole for *_, whole in seen[:-1])
    if gathers and plugin:
        assert all(not given and not split for _, given, split, _ in seen[:-1])
    else:
        assert all(given == (mode == "search") and split == plugin for _, given, split, _ in seen[:-1])
    assert seen[-1] == (32, mode == "search", plugin, True)  # the default: one whole table
    want = reference(Q.to(USER_MODES.get(mode, torch.float32))[None], index["codes"],
                     index["residuals"], index["offsets"], index["centroids"],
                     index["bucket_weights"], NBITS, pids)
    tol = {"fp16": 1e-2, "bf16": 5e-2}.get(mode, 1e-4)
    if user:
        seen.clear()
        gathered = calls["gather"]()
        assert seen == [(32, False, False, True)]
        torch.testing.assert_close(gathered.double().cpu(), want, rtol=tol, atol=tol)
    for got in (split, default):
        torch.testing.assert_close(got.double().cpu(), want, rtol=tol, atol=tol)


def test_budget_rule_restores_the_whole_table_rule_on_error():
    with pytest.raises(RuntimeError), budget_rule():
        assert residual.WHOLE_TABLE_ROWS == 0
        raise RuntimeError
    assert residual.WHOLE_TABLE_ROWS == 64
