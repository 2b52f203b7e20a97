"""The centroid-score table's build at colbert-ai's centroid counts, by tile shape.

``python -m experiments.bench_centroid_table [--centroids 65536 262144] [--rows 32 128]
[--out DIR]`` (GPU)

``ops/residual.query_centroid_scores`` (S = centroids @ Q_rows^T, fp16 centroids and queries,
fp32 sums stored in fp16, the residual kernels' default table for fp16 queries) with its default
tile (``table_tile``) and with each tile of ``TILES`` (centroids, query rows, warps, stages), beside
torch's product (cuBLAS, ``centroids @ Q_rows.T``): the table is read by every scoring call, and
at C = 2^18 it is 64 MiB of centroids read per call. Each tile's table is checked against the
default's before it is timed. Rows go to ``OUT/centroid_table.json`` (harness format), with the
bytes moved per call and the GB/s they make.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys

import torch
import torch.nn.functional as F

from . import harness

__all__ = ["main", "TILES"]

SUITE = "centroid_table"
DIM = 128
# (BLOCK_C, BLOCK_R, num_warps, num_stages) tried beside the default (64 x 64 x 4 x 3: the tile
# before run 154). At d <= 128 the product is one step, so a single stage only frees shared
# memory for more programs per SM.
TILES = ((64, 64, 4, 3), (64, 32, 4, 1), (64, 64, 4, 1), (64, 128, 4, 1), (64, 128, 8, 1),
         (128, 64, 8, 1))


@contextlib.contextmanager
def tiles(block_c: int, block_r: int, num_warps: int, num_stages: int):
    """ops/residual's table build forced to this tile within the block."""
    from tilemaxsim_plaid.ops import residual

    before = residual.TABLE_BLOCK_C, residual.TABLE_NUM_STAGES, residual.table_tile
    residual.TABLE_BLOCK_C, residual.TABLE_NUM_STAGES = block_c, num_stages
    residual.table_tile = lambda rows: (block_r, num_warps)
    try:
        yield
    finally:
        residual.TABLE_BLOCK_C, residual.TABLE_NUM_STAGES, residual.table_tile = before


def tiled(tile, call):
    with tiles(*tile):
        return call()


def default_tile(rows: int) -> tuple[int, int, int, int]:
    """The tile ops/residual takes for ``rows`` query rows."""
    from tilemaxsim_plaid.ops import residual
    return (residual.TABLE_BLOCK_C, *residual.table_tile(rows), residual.TABLE_NUM_STAGES)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_centroid_table",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--centroids", type=int, nargs="+", default=[1 << 16, 1 << 18])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128],
                        help="query rows of the table (B * Lq)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="results/centroid_table")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_centroid_table times GPU kernels and needs a CUDA device")
    from tilemaxsim_plaid.ops import residual

    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    rows_out = []
    for C in args.centroids:
        centroids = F.normalize(torch.randn(C, DIM, generator=g), dim=-1).half().to(device)
        for R in args.rows:
            Q = F.normalize(torch.randn(1, R, DIM, generator=g), dim=-1).half().to(device)
            moved = (C * DIM + C * R + R * DIM) * 2
            shape = f"C={C} rows={R} d={DIM} fp16"

            def build():
                return residual.query_centroid_scores(Q, centroids, torch.float16)

            want = build()
            default = default_tile(R)
            ways = [("default " + "x".join(map(str, default)), default)]
            ways += [("tiles " + "x".join(map(str, t)), t) for t in TILES if t != default]
            calls = {}
            for name, t in ways:
                with tiles(*t):
                    torch.testing.assert_close(build(), want, rtol=2e-3, atol=2e-3)
                calls[name] = lambda t=t: tiled(t, build)
            rows_q = Q[0]
            torch.testing.assert_close(centroids @ rows_q.T, want, rtol=2e-3, atol=2e-3)
            calls["torch matmul"] = lambda: centroids @ rows_q.T
            # Alternated rounds, so that clocks settling cannot pass for a tile's cost.
            times = harness.rounds_ms(calls, args.rounds)
            for name, round_ms in times.items():
                ms = statistics.median(round_ms)
                rows_out.append({"suite": SUITE, "shape": shape, "provider": name, "ms": ms,
                                 "round_ms": round_ms, "bytes": moved,
                                 "gbps": moved / ms / 1e6})
                print(f"{shape:<30} {name:<22} {ms:8.4f} ms {moved / ms / 1e6:8.1f} GB/s "
                      f"(rounds {' '.join(f'{m:.4f}' for m in round_ms)})", flush=True)
    path = harness.write_results(rows_out, args.out, SUITE,
                                 ceilings=harness.measure_ceilings(),
                                 meta={"argv": sys.argv if argv is None else argv})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
