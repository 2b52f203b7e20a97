"""GPU diagnosis of the residual kernel: which factor breaks the unaligned-bytes test, and how
fp32 queries (tf32x3 products) time per config. Prints two tables."""

import dataclasses
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, ".")
from experiments.bench_compressed import make_index  # noqa: E402
from tests.kernels.test_maxsim_residual import expected, norms_of, random_index  # noqa: E402
from tilemaxsim_plaid.ops.residual import ResidualConfig, maxsim_residual  # noqa: E402

dev = torch.device("cuda")


def unaligned(index, nbits, dim):
    row = dim * nbits // 8
    wide = torch.randint(0, 256, (index["residuals"].shape[0], row + 1), dtype=torch.uint8, device=dev)
    wide[:, 1:] = index["residuals"]
    out = dict(index)
    out["residuals"] = wide[:, 1:]
    return out


def check(nbits, decode, bytes_, block_d, block_t, docs, dtype=torch.float16, dim=96):
    torch.manual_seed(0)
    index = random_index(dev, dim, nbits)
    if bytes_:
        index = unaligned(index, nbits, dim)
    Q = F.normalize(torch.randn(1, 31, dim), dim=-1).to(dtype).to(dev)
    cfg = ResidualConfig(decode=decode, block_t=block_t, block_t_tail=32 if block_t == 64 else 16,
                         docs_per_program=docs, block_d=block_d)
    out = maxsim_residual(Q, index["codes"], index["residuals"], index["offsets"], index["centroids"],
                          index["bucket_weights"], nbits, inv_norms=norms_of(index, nbits), config=cfg)
    ref = expected(Q, index, nbits).to(dev)
    finite = torch.isfinite(ref)
    bad_inf = bool((torch.isfinite(out.double()) != finite).any())
    return float((out.double() - ref)[finite].abs().max()), bad_inf


print("pairs decoder by chunk width (d = 128, fp16, word loads)")
print("nbits block_d block_t  max|diff|")
for nbits in (1, 2, 4):
    for block_d in (16, 32, 64, 128):
        for block_t in (32, 64):
            try:
                diff, bad = check(nbits, "pairs", False, block_d, block_t, 1, dim=128)
                print(f"{nbits:>5} {block_d:>7} {block_t:>7}  {diff:9.2e} {'INF-MISMATCH' if bad else ''}")
            except Exception as error:
                print(f"{nbits:>5} {block_d:>7} {block_t:>7}  ERROR {type(error).__name__}: {str(error)[:100]}")
if "--timing" not in sys.argv:
    sys.exit(0)

index = make_index(100_000, 65536, 128, 2, dev)
Q32 = F.normalize(torch.randn(1, 32, 128), dim=-1).to(dev)
configs = [("default", ResidualConfig()), ("warps4", ResidualConfig(num_warps=4)),
           ("bt64 w4", ResidualConfig(block_t=64, block_t_tail=32, num_warps=4)),
           ("bt16 tail16", ResidualConfig(block_t=16)), ("select", ResidualConfig(decode="select")),
           ("stages2", ResidualConfig(num_stages=2)), ("warps1", ResidualConfig(num_warps=1))]
print("\nconfig        dtype     ms (100k docs, mean 70 tokens, C=65536, nbits 2, Lq 32)")
args = (index["codes"], index["residuals"], index["offsets"], index["centroids"], index["bucket_weights"], 2)
for dtype, split in ((torch.float16, False), (torch.float32, False), (torch.float32, True)):
    for name, cfg in configs if dtype == torch.float32 else configs[:1]:
        Q = Q32.to(dtype)
        fn = lambda: maxsim_residual(Q, *args, inv_norms=index["inv_norms"], config=cfg,
                                     split_query=split, validate=False)
        name = name + (" split" if split else "")
        try:
            ms = triton.testing.do_bench(fn, warmup=50, rep=300)
            print(f"{name:<19} {str(dtype)[6:]:<9} {ms:.3f}")
        except Exception as error:
            print(f"{name:<19} {str(dtype)[6:]:<9} ERROR {type(error).__name__}: {str(error)[:100]}")
