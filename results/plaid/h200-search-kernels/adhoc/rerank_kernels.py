"""Ad-hoc (run from the tree as experiments/_rerank_kernels.py at commit 6cb3f28, then removed):
GPU kernels of one 100k / 1M rerank scoring call (fp16x2, fp16), by duration.

    PYTHONPATH=$PWD python3 -m experiments._rerank_kernels
"""
import torch
from torch.profiler import ProfilerActivity, profile

from experiments import bench_compressed as BC
from experiments.harness import time_ms
from tilemaxsim_plaid.ops.residual import maxsim_residual, query_centroid_scores

dev = torch.device("cuda")
index = BC.make_index(1_000_000, 65536, 128, 2, dev)
Q = BC.queries(1, 32, 128, dev)[0].float()
g = torch.Generator().manual_seed(0)
for size in (100_000, 1_000_000):
    pids = torch.randint(0, 1_000_000, (size,), generator=g).to(dev)
    for mode in ("fp16x2", "fp16"):
        def call():
            if mode == "fp16":
                S = query_centroid_scores(Q[None], index["centroids"].float())
                return maxsim_residual(Q.half()[None], index["codes"], index["residuals"], index["offsets"],
                                       index["centroids"], index["bucket_weights"], 2, pids,
                                       inv_norms=index["inv_norms"], centroid_scores=S, validate=False)
            return maxsim_residual(Q[None], index["codes"], index["residuals"], index["offsets"],
                                   index["centroids"].float(), index["bucket_weights"], 2, pids,
                                   inv_norms=index["inv_norms"], split_query=True, validate=False)
        call(); torch.cuda.synchronize()
        t = time_ms(call, warmup_ms=50, rep_ms=300)[0]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        rows = sorted(((e.key, e.device_time_total / 5, e.count / 5) for e in prof.key_averages()
                       if e.device_time_total > 0), key=lambda r: -r[1])
        print(f"== size {size} {mode}: do_bench {t:.3f} ms")
        for key, us, n in rows[:8]:
            print(f"   {us:9.1f} us  x{n:.0f}  {key[:90]}")
