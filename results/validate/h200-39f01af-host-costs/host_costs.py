"""Host microseconds per call of the deferred-check pieces and of the ops at tiny sizes."""
import time, torch, triton
from tilemaxsim_plaid.ops import checks
from tilemaxsim_plaid.kernels.value_range import INT64_MAX, _value_range_kernel
from experiments import bench_validate as bv

dev = torch.device("cuda")
N = 100_000
pids = torch.randperm(N, device=dev)
offs = torch.arange(N + 1, device=dev) * 70
init = torch.tensor([INT64_MAX, -INT64_MAX - 1], device=dev)
stats = init.clone()
side = torch.cuda.Stream(dev)

def us(fn, calls=2000):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e6 / calls

def pend_side_read():
    v = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        v.copy_(stats, non_blocking=True); e = torch.cuda.Event(); e.record(side)
    stats.record_stream(side)
    e.synchronize(); v.tolist()
def pend_cur_read():
    checks._Pending(stats).read()
pool = [pids.clone() for _ in range(80)]; at = [0]
def pids_pool():
    at[0] = (at[0] + 1) % 80; return pool[at[0]]
def full_deferred():
    b = checks.DataChecks(); b.in_range("pids", pids_pool(), 0, N, defer=True); b.run(); b.safe("pids", None); b.finish()

rows = [
 ("range_stats (clone+kernel)", lambda: checks._kernel_range_stats(pids)),
 ("range_stats + clamp, one kernel", lambda: checks._kernel_range_stats(pids, (0, N - 1))),
 ("init clone", lambda: init.clone()),
 ("value_range launch", lambda: _value_range_kernel[(25,)](pids, stats, pids, N, 0, 0, BLOCK=4096, CLAMP=False)),
 ("clamp", lambda: pids.clamp(0, N - 1)),
 ("torch.empty pinned", lambda: torch.empty(2, dtype=torch.int64, pin_memory=True)),
 ("pending side stream + read", pend_side_read),
 ("pending current stream + read", pend_cur_read),
 ("DataChecks deferred pids run+finish", full_deferred),
 ("offsets stats, torch ops", lambda: torch.stack([offs[0], offs[-1], ((offs[1:] - offs[:-1]) < 0).sum(), (offs[1:] - offs[:-1]).max()])),
 ("offsets stats + clamp, one kernel", lambda: checks._kernel_offsets_stats(offs, 10**9)),
]
for name, fn in rows:
    print(f"{name:<44} {us(fn):8.1f} us", flush=True)

g = torch.Generator().manual_seed(0)
docs = 2000
import sys
if 'pieces' in sys.argv: raise SystemExit
entries = bv.packed_inputs(docs, dev, g) + bv.residual_inputs(docs, 1 << 16, 2, dev, g) + bv.pq_inputs(docs, dev, g)
for e in entries:
    for way, fn in e["ways"].items():
        print(f"{e['op']:<16} {e['input']:<22} {way:<26} host {us(fn, 500):8.1f} us/call at {docs} docs", flush=True)
