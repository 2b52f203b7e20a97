"""Ad-hoc (run from the tree as experiments/_s_sweep.py at commit 6cb3f28, then removed): launch
configurations of the centroid-score table kernel, C = 65,536, 32/64/128 query rows.

    PYTHONPATH=$PWD python3 -m experiments._s_sweep
"""
import torch
import triton
from experiments.harness import time_ms
from tilemaxsim_plaid.ops import residual as R
from tilemaxsim_plaid.ops.launch import dot_precision

dev = torch.device("cuda")
C, d = 65536, 128
cents = torch.nn.functional.normalize(torch.randn(C, d, device=dev), dim=-1).half().float()
for rows_n in (32, 64, 128):
    rows = torch.nn.functional.normalize(torch.randn(rows_n, d, device=dev), dim=-1)
    exact = (cents.double() @ rows.double().T)
    base = time_ms(lambda: R.query_centroid_scores(rows[None], cents), warmup_ms=30, rep_ms=200)[0]
    cub = time_ms(lambda: cents @ rows.T, warmup_ms=30, rep_ms=200)[0]
    print(f"rows={rows_n}: current {base*1e3:.1f} us, cuBLAS fp32 {cub*1e3:.1f} us")
    results = []
    for bc in (32, 64, 128, 256):
        for br in (16, 32, 64):
            if br > max(16, rows_n):
                continue
            for warps in (2, 4, 8):
                for stages in (1, 2, 3):
                    out = torch.full((C, rows_n), float("nan"), device=dev)
                    grid = (triton.cdiv(C, bc), triton.cdiv(rows_n, br))
                    def run():
                        R._query_centroid_scores_kernel[grid](
                            cents, rows, out, C, rows_n, d, cents.stride(0), cents.stride(1),
                            rows.stride(0), rows.stride(1), out.stride(0), BLOCK_C=bc, BLOCK_R=br,
                            BLOCK_D=128, INPUT_PRECISION=dot_precision(torch.float32), UPCAST=False,
                            num_warps=warps, num_stages=stages)
                    try:
                        run()
                        err = (out.double() - exact).abs().max().item()
                        t = time_ms(run, warmup_ms=20, rep_ms=100)[0]
                    except Exception as e:
                        print(f"  bc={bc} br={br} w={warps} s={stages}: {type(e).__name__}")
                        continue
                    results.append((t, bc, br, warps, stages, err))
    for t, bc, br, warps, stages, err in sorted(results)[:6]:
        print(f"  {t*1e3:6.1f} us  BLOCK_C={bc} BLOCK_R={br} warps={warps} stages={stages} max_err={err:.1e}")
