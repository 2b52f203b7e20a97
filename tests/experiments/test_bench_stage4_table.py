"""bench_stage4_table's two calls score alike and are the launches it names (timing needs a GPU)."""

import torch
import torch.nn.functional as F

from experiments.bench_stage4_table import stage4_calls
from experiments.bench_compressed import make_index
from tilemaxsim_plaid.ops import residual
from tilemaxsim_plaid.reference import maxsim_residual as maxsim_residual_reference


def test_split_and_whole_tables_score_as_the_reference(monkeypatch):
    C, dim, nbits = 64, 32, 2
    index = make_index(40, C, dim, nbits, torch.device("cpu"))
    Q = F.normalize(torch.randn(32, dim, generator=torch.Generator().manual_seed(3)), dim=-1)
    table = index["centroids"].float() @ Q.T
    # A budget that fits 16 of the 32 query rows: the default splits the table in two tiles.
    monkeypatch.setattr(residual, "MAX_CENTROID_TABLE_BYTES", C * 16 * 4)
    assert residual.centroid_table_tiles(C, 1, 32, 4) == (1, 16)
    launches = []
    real = residual._launch_kernel
    monkeypatch.setattr(residual, "_launch_kernel",
                        lambda Q3, *a, **k: launches.append(Q3.shape[1]) or real(Q3, *a, **k))
    pids = torch.tensor([0, 3, 7, 8, 20, 39])
    calls = stage4_calls(index, Q, table, pids)
    split, whole = calls["default"](), calls["whole"]()
    assert launches == [16, 16, 32]
    want = maxsim_residual_reference(Q[None], index["codes"], index["residuals"],
                                     index["offsets"], index["centroids"],
                                     index["bucket_weights"], nbits, pids)
    torch.testing.assert_close(split.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(whole.double(), want, rtol=1e-4, atol=1e-4)
    launches.clear()
    rerank = stage4_calls(index, Q, None, pids)
    torch.testing.assert_close(rerank["default"]().double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rerank["whole"]().double(), want, rtol=1e-4, atol=1e-4)
    assert launches == [16, 16, 32]


def test_where_no_tile_fits_the_default_is_the_plugins_gathered_fp32_call(monkeypatch):
    C, dim, nbits = 64, 32, 2
    index = make_index(30, C, dim, nbits, torch.device("cpu"))
    Q = F.normalize(torch.randn(32, dim, generator=torch.Generator().manual_seed(4)), dim=-1)
    monkeypatch.setattr(residual, "MAX_CENTROID_TABLE_BYTES", C * 8 * 4)  # 8 rows < 16
    assert residual.centroid_table_tiles(C, 1, 32, 4) is None
    seen = []
    real = residual._launch_kernel
    monkeypatch.setattr(residual, "_launch_kernel", lambda Q3, *a, **k: seen.append(
        (Q3.shape[1], a[-2] is not None, a[-1])) or real(Q3, *a, **k))
    pids = torch.tensor([1, 2, 9, 29])
    calls = stage4_calls(index, Q, index["centroids"].float() @ Q.T, pids)
    want = maxsim_residual_reference(Q[None], index["codes"], index["residuals"],
                                     index["offsets"], index["centroids"],
                                     index["bucket_weights"], nbits, pids)
    for name in ("default", "whole"):
        torch.testing.assert_close(calls[name]().double(), want, rtol=1e-4, atol=1e-4)
    # (query rows, a table passed, split_query): the gathered fp32 call, then the whole table.
    assert seen == [(32, False, False), (32, True, True)]
