import pytest
import torch

from experiments import bench_centroid_table
from tilemaxsim_plaid.ops import residual
from tilemaxsim_plaid.ops.residual import query_centroid_scores


def test_tiles_set_the_table_build_and_restore_it(device):
    default = bench_centroid_table.default_tile(32)
    g = torch.Generator().manual_seed(0)
    centroids = torch.randn(200, 128, generator=g).half()
    Q = torch.randn(1, 32, 128, generator=g).half()
    want = (centroids.double() @ Q[0].double().T)
    with bench_centroid_table.tiles(128, 32, 8, 1):
        assert bench_centroid_table.default_tile(32) == (128, 32, 8, 1)
        table = query_centroid_scores(Q.to(device), centroids.to(device), torch.float16)
    torch.testing.assert_close(table.double().cpu(), want, rtol=1e-3, atol=1e-3)
    assert bench_centroid_table.default_tile(32) == default


def test_table_tile_reads_the_centroids_once_for_up_to_128_rows():
    assert residual.table_tile(32) == (32, 4)
    assert residual.table_tile(33) == (64, 4)
    assert residual.table_tile(128) == (128, 8)
    assert residual.table_tile(300) == (128, 8)
    assert residual.table_tile(3) == (residual.MIN_DOT_DIM, 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_main_needs_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="CUDA"):
        bench_centroid_table.main(["--out", str(tmp_path)])
