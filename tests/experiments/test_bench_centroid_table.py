import pytest
import torch

from experiments import bench_centroid_table
from tilemaxsim_plaid.ops import residual
from tilemaxsim_plaid.ops.residual import query_centroid_scores


def test_tiles_set_the_table_build_and_restore_it():
    default = (residual.TABLE_BLOCK_C, residual.TABLE_BLOCK_R, residual.TABLE_NUM_WARPS)
    g = torch.Generator().manual_seed(0)
    centroids = torch.randn(200, 128, generator=g).half()
    Q = torch.randn(1, 32, 128, generator=g).half()
    want = (centroids.double() @ Q[0].double().T)
    with bench_centroid_table.tiles(128, 32, 8):
        assert (residual.TABLE_BLOCK_C, residual.TABLE_BLOCK_R, residual.TABLE_NUM_WARPS) == (
            128, 32, 8)
        table = query_centroid_scores(Q, centroids, torch.float16)
    torch.testing.assert_close(table.double(), want, rtol=1e-3, atol=1e-3)
    assert (residual.TABLE_BLOCK_C, residual.TABLE_BLOCK_R, residual.TABLE_NUM_WARPS) == default


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_main_needs_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="CUDA"):
        bench_centroid_table.main(["--out", str(tmp_path)])
