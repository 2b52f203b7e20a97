"""The centroid-score table's build at colbert-ai's centroid counts, by tile shape.

``python -m experiments.bench_centroid_table [--centroids 65536 262144] [--rows 32 128]
[--out DIR]`` (GPU)

``ops/residual.query_centroid_scores`` (S = centroids @ Q_rows^T, fp16 centroids and queries,
fp32 sums stored in fp16, the residual kernels' default table for fp16 queries) with its default
tiles (TABLE_BLOCK_C, TABLE_BLOCK_R, TABLE_NUM_WARPS) and with each tile of ``TILES``, beside
torch's product (cuBLAS, ``centroids @ Q_rows.T``): the table is read by every scoring call, and
at C = 2^18 it is 64 MiB of centroids read per call. Each tile's table is checked against the
default's before it is timed. Rows go to ``OUT/centroid_table.json`` (harness format), with the
bytes moved per call and the GB/s they make.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F

from . import harness

__all__ = ["main", "TILES"]

SUITE = "centroid_table"
DIM = 128
# (BLOCK_C, BLOCK_R, num_warps) tried beside the default.
TILES = ((64, 32, 4), (128, 32, 4), (128, 32, 8), (256, 32, 8), (128, 64, 8), (256, 64, 8))


@contextlib.contextmanager
def tiles(block_c: int, block_r: int, num_warps: int):
    """ops/residual's table tiles set to these within the block."""
    from tilemaxsim_plaid.ops import residual

    before = residual.TABLE_BLOCK_C, residual.TABLE_BLOCK_R, residual.TABLE_NUM_WARPS
    residual.TABLE_BLOCK_C, residual.TABLE_BLOCK_R, residual.TABLE_NUM_WARPS = (
        block_c, block_r, num_warps)
    try:
        yield
    finally:
        residual.TABLE_BLOCK_C, residual.TABLE_BLOCK_R, residual.TABLE_NUM_WARPS = before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_centroid_table",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--centroids", type=int, nargs="+", default=[1 << 16, 1 << 18])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128],
                        help="query rows of the table (B * Lq)")
    parser.add_argument("--out", default="results/centroid_table")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_centroid_table times GPU kernels and needs a CUDA device")
    from tilemaxsim_plaid.ops import residual

    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    rows_out = []
    default = (residual.TABLE_BLOCK_C, residual.TABLE_BLOCK_R, residual.TABLE_NUM_WARPS)
    for C in args.centroids:
        centroids = F.normalize(torch.randn(C, DIM, generator=g), dim=-1).half().to(device)
        for R in args.rows:
            Q = F.normalize(torch.randn(1, R, DIM, generator=g), dim=-1).half().to(device)
            moved = (C * DIM + C * R + R * DIM) * 2
            shape = f"C={C} rows={R} d={DIM} fp16"

            def build():
                return residual.query_centroid_scores(Q, centroids, torch.float16)

            want = build()
            ways = [("default " + "x".join(map(str, default)), default)]
            ways += [("tiles " + "x".join(map(str, t)), t) for t in TILES if t != default]
            for name, t in ways:
                with tiles(*t):
                    torch.testing.assert_close(build(), want, rtol=2e-3, atol=2e-3)
                    ms = harness.time_ms(build)[0]
                rows_out.append({"suite": SUITE, "shape": shape, "provider": name, "ms": ms,
                                 "bytes": moved, "gbps": moved / ms / 1e6})
                print(f"{shape:<30} {name:<22} {ms:8.4f} ms {moved / ms / 1e6:8.1f} GB/s",
                      flush=True)
            rows_q = Q[0]
            torch.testing.assert_close(centroids @ rows_q.T, want, rtol=2e-3, atol=2e-3)
            ms = harness.time_ms(lambda: centroids @ rows_q.T)[0]
            rows_out.append({"suite": SUITE, "shape": shape, "provider": "torch matmul",
                             "ms": ms, "bytes": moved, "gbps": moved / ms / 1e6})
            print(f"{shape:<30} {'torch matmul':<22} {ms:8.4f} ms {moved / ms / 1e6:8.1f} GB/s",
                  flush=True)
    path = harness.write_results(rows_out, args.out, SUITE,
                                 ceilings=harness.measure_ceilings(),
                                 meta={"argv": sys.argv if argv is None else argv})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
