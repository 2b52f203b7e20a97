import torch
from experiments import bench_dense_variants as dv, bench_grid as bg
from tilemaxsim_plaid import reference
dev = torch.device("cuda")
for name in ("d256-uniform", "d512", "d256-lognormal-150"):
    cell = dv.make_cell(name, bg.Sizing())
    x = bg.make_inputs(cell, dev)
    ours = bg.provider_ours(cell, x)
    want = reference.maxsim_packed(x.Q[0], x.D_packed, x.offsets).to(dev)
    out = {"default": ours()}
    for v in ("256-column chunks", "256-column chunks w8"):
        with dv.VARIANTS[v]():
            out[v] = ours()
    for v, got in out.items():
        err = (got.double() - want).abs()
        rel = err / want.abs().clamp_min(1e-6)
        print(f"{name:20s} {v:22s} max abs {err.max().item():.3e} max rel {rel.max().item():.3e} "
              f"vs default max abs {(got - out['default']).abs().max().item():.3e} "
              f"nonfinite {int((~torch.isfinite(got)).sum())}", flush=True)
