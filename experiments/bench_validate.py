"""What ``validate=True`` (the default) costs against ``validate=False``, for every public op.

``python -m experiments.bench_validate [--num-docs 100000] [--rounds 5] [--out DIR]``

One fp16 query of 32 tokens, d = 128, documents of MS MARCO-like lengths (bench.py's). For
each op and input, the ways a user calls it, timed in alternated rounds (a round times every
way once, each round starting one way further on, so clock drift and a place in the round hit
them alike; a row keeps the median over rounds):

- ``validate=False``: a caller that vouches for its inputs (``maxsim_packed`` given max_doc_len);
- ``validate=True``: the default call with the same tensors every call, so the index's checks
  are remembered (``ops/checks.py``);
- ``new pids validate=True`` / ``new pids validate=False``: another pid list each call, from a
  pool larger than the check cache, as a reranker meets it (with validation: checked after the
  launch, which takes them clamped); the second is the first's baseline;
- ``new documents validate=True`` / ``new documents validate=False`` (``maxsim_packed`` over every
  document; ``maxsim_padded``, with its doc_lengths): the same documents as a new tensor each
  call (its version counter moved, :func:`_renewed`), as a reranker meets the embeddings it
  gathers per query; the second is the first's baseline; ``new batch`` (``maxsim_packed``,
  ``maxsim_pq``: its codes) renews the offsets too, as a reranker that packs its candidates
  meets them;
- ``inference tensors`` / ``inference tensors validate=False``: copies of the index made under
  ``torch.inference_mode()``, whose tensors have no version counter: their range checks are read
  on every call (after the launch once remembered); the second is the first's baseline.

Inputs: ``maxsim_packed`` over every document and over a permutation of them as pids;
``maxsim_padded`` on the documents padded to 128 tokens with doc_lengths; ``maxsim_residual``
(nbits 1, 2, 4, C = 2^16, the table path with inv_norms) and ``maxsim_pq`` (M = 16, random
codes), each over every document and over pids; flash-maxsim's default packed call in the same
rounds where it is installed. Each way is timed three ways a round: ``ms`` by
``triton.testing.do_bench`` (L2 flushed between calls), ``loop_ms``, LOOP_CALLS calls back to
back over one synchronisation, divided (what a loop of calls sees, the host's work included),
and ``host_ms``, each call alone from an idle GPU (:func:`host_ms`: the host's work per call,
which a checked call must keep under the kernel's time). Before timing, every way's scores are checked equal to
``validate=False``'s, and those against the float64 reference on the first documents. Rows go
to ``OUT/validate.json`` and ``.csv``; the table printed last gives each way's ratio to its
baseline (:func:`baseline`) on the same input.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from . import harness
from .bench import max_relative_error, msmarco_like_lengths
from .bench_compressed import _timer, make_index, queries
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.dense import maxsim_packed, maxsim_padded
from tilemaxsim_plaid.ops.pq import maxsim_pq
from tilemaxsim_plaid.ops.residual import maxsim_residual

__all__ = ["main"]

SUITE = "validate"
QUERY_LEN, DIM = 32, 128
PADDED_LEN = 128  # bench.py's padded headline length
PQ_M = 16
CHECK_DOCS = 256  # documents checked against the float64 reference (at most)
POOL = 80  # distinct pid lists cycled by ``new pids``: more than checks.MAX_CACHED_TENSORS
TOLERANCE = 2e-3
LOOP_CALLS = 50
OPS = ("packed", "padded", "residual", "pq")


def _pool(pids: torch.Tensor):
    """A function giving another copy of ``pids`` each call (POOL of them, cycled)."""
    copies = [pids.clone() for _ in range(POOL)]
    state = {"at": 0}

    def take():
        state["at"] = (state["at"] + 1) % POOL
        return copies[state["at"]]

    return take


def _renewed(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its version counter moved, as a tensor written since its last call reads to the
    checks (a new tensor each call, without the copy's time)."""
    torch.autograd.graph.increment_version(t)
    return t


def _inference(*tensors):
    """Copies of ``tensors`` made under ``torch.inference_mode()`` (no version counter)."""
    with torch.inference_mode():
        return tuple(t.clone() for t in tensors)


def _subset(offsets: torch.Tensor, pids: torch.Tensor, *per_token: torch.Tensor):
    """The documents ``pids`` as an index of their own, on the CPU: (offsets, *per_token rows),
    so the float64 reference reads only the documents it checks."""
    offsets, pids = offsets.cpu(), pids.cpu()
    rows = torch.cat([torch.arange(int(offsets[p]), int(offsets[p + 1])) for p in pids.tolist()])
    sub = torch.zeros(pids.numel() + 1, dtype=torch.int64)
    sub[1:] = (offsets[pids + 1] - offsets[pids]).cumsum(0)
    return (sub, *(t.cpu()[rows] for t in per_token))


def packed_inputs(num_docs: int, device, generator) -> list[dict]:
    lengths = msmarco_like_lengths(num_docs, generator)
    offsets = torch.zeros(num_docs + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    D = torch.randn(int(offsets[-1]), DIM, generator=generator).half().to(device)
    offsets = offsets.to(device)
    max_len = int(lengths.max())
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    pids = torch.randperm(num_docs, generator=generator).to(device)
    new_pids = _pool(pids)
    D_inf, offsets_inf = _inference(D, offsets)
    first = torch.arange(min(CHECK_DOCS, num_docs))
    sub, rows = _subset(offsets, first, D)
    ref_all = reference.maxsim_packed(Q.cpu(), rows, sub)
    sub, rows = _subset(offsets, pids[:CHECK_DOCS], D)
    ref_pids = reference.maxsim_packed(Q.cpu(), rows, sub)
    ways_all = {
        "validate=False": lambda: maxsim_packed(Q, D, offsets, max_doc_len=max_len, validate=False),
        "validate=True": lambda: maxsim_packed(Q, D, offsets),
        "new documents validate=False": lambda: maxsim_packed(
            Q, _renewed(D), offsets, max_doc_len=max_len, validate=False),
        "new documents validate=True": lambda: maxsim_packed(Q, _renewed(D), offsets),
        "new batch validate=False": lambda: maxsim_packed(
            Q, _renewed(D), _renewed(offsets), max_doc_len=max_len, validate=False),
        "new batch validate=True": lambda: maxsim_packed(Q, _renewed(D), _renewed(offsets)),
        "inference tensors validate=False": lambda: maxsim_packed(
            Q, D_inf, offsets_inf, max_doc_len=max_len, validate=False),
        "inference tensors": lambda: maxsim_packed(Q, D_inf, offsets_inf),
    }
    try:
        import flash_maxsim
        cu = offsets.to(torch.int32)
        ways_all["flash_maxsim"] = lambda: flash_maxsim.flash_maxsim_packed(Q, D, cu, max_seqlen_d=max_len)
    except ImportError:
        pass
    ways_pids = {
        "validate=False": lambda: maxsim_packed(Q, D, offsets, pids, max_doc_len=max_len, validate=False),
        "validate=True": lambda: maxsim_packed(Q, D, offsets, pids),
        "new pids validate=False": lambda: maxsim_packed(Q, D, offsets, new_pids(), max_doc_len=max_len,
                                                         validate=False),
        "new pids validate=True": lambda: maxsim_packed(Q, D, offsets, new_pids()),
    }
    return [dict(op="maxsim_packed", input="all", ways=ways_all, ref=ref_all),
            dict(op="maxsim_packed", input="pids", ways=ways_pids, ref=ref_pids)]


def padded_inputs(num_docs: int, device, generator) -> list[dict]:
    lengths = msmarco_like_lengths(num_docs, generator).clamp_max(PADDED_LEN).to(device)
    D = torch.randn(num_docs, PADDED_LEN, DIM, generator=generator).half().to(device)
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    ref = reference.maxsim_padded(Q.cpu(), D[:CHECK_DOCS].cpu(), lengths[:CHECK_DOCS].cpu())
    D_inf, lengths_inf = _inference(D, lengths)
    ways = {"validate=False": lambda: maxsim_padded(Q, D, lengths, validate=False),
            "validate=True": lambda: maxsim_padded(Q, D, lengths),
            "new documents validate=False": lambda: maxsim_padded(Q, _renewed(D), _renewed(lengths),
                                                                  validate=False),
            "new documents validate=True": lambda: maxsim_padded(Q, _renewed(D), _renewed(lengths)),
            "inference tensors validate=False": lambda: maxsim_padded(Q, D_inf, lengths_inf,
                                                                      validate=False),
            "inference tensors": lambda: maxsim_padded(Q, D_inf, lengths_inf)}
    return [dict(op="maxsim_padded", input=f"Ld={PADDED_LEN}", ways=ways, ref=ref)]


def residual_inputs(num_docs: int, num_centroids: int, nbits: int, device, generator) -> list[dict]:
    index = make_index(num_docs, num_centroids, DIM, nbits, device)
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    call = (Q, index["codes"], index["residuals"], index["offsets"], index["centroids"],
            index["bucket_weights"], nbits)
    norms = index["inv_norms"]
    call_inf = (Q, *_inference(*call[1:6]), nbits)
    norms_inf, = _inference(norms)
    pids = torch.randperm(num_docs, generator=generator).to(device)
    new_pids = _pool(pids)
    refs = []
    for ids in (torch.arange(min(CHECK_DOCS, num_docs)), pids[:CHECK_DOCS]):
        sub, codes, residuals = _subset(index["offsets"], ids, index["codes"], index["residuals"])
        refs.append(reference.maxsim_residual(Q, codes, residuals, sub, index["centroids"],
                                              index["bucket_weights"], nbits))
    ref_all, ref_pids = refs
    name = f"nbits={nbits} C={num_centroids}"
    return [
        dict(op="maxsim_residual", input=f"{name} all", ref=ref_all, ways={
            "validate=False": lambda: maxsim_residual(*call, inv_norms=norms, validate=False),
            "validate=True": lambda: maxsim_residual(*call, inv_norms=norms),
            "inference tensors validate=False": lambda: maxsim_residual(
                *call_inf, inv_norms=norms_inf, validate=False),
            "inference tensors": lambda: maxsim_residual(*call_inf, inv_norms=norms_inf)}),
        dict(op="maxsim_residual", input=f"{name} pids", ref=ref_pids, ways={
            "validate=False": lambda: maxsim_residual(*call, pids, inv_norms=norms, validate=False),
            "validate=True": lambda: maxsim_residual(*call, pids, inv_norms=norms),
            "new pids validate=False": lambda: maxsim_residual(*call, new_pids(), inv_norms=norms,
                                                               validate=False),
            "new pids validate=True": lambda: maxsim_residual(*call, new_pids(), inv_norms=norms)}),
    ]


def pq_inputs(num_docs: int, device, generator) -> list[dict]:
    lengths = msmarco_like_lengths(num_docs, generator)
    offsets = torch.zeros(num_docs + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    T = int(offsets[-1])
    codes = torch.randint(0, 256, (T, PQ_M), generator=generator, dtype=torch.uint8).to(device)
    books = (torch.randn(PQ_M, 256, DIM // PQ_M, generator=generator) * 0.1).half().to(device)
    offsets = offsets.to(device)
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    pids = torch.randperm(num_docs, generator=generator).to(device)
    new_pids = _pool(pids)
    codes_inf, offsets_inf, books_inf = _inference(codes, offsets, books)
    refs = []
    for ids in (torch.arange(min(CHECK_DOCS, num_docs)), pids[:CHECK_DOCS]):
        sub, rows = _subset(offsets, ids, codes)
        refs.append(reference.maxsim_pq(Q, rows, sub, books))
    ref_all, ref_pids = refs
    return [
        dict(op="maxsim_pq", input=f"M={PQ_M} all", ref=ref_all, ways={
            "validate=False": lambda: maxsim_pq(Q, codes, offsets, books, validate=False),
            "validate=True": lambda: maxsim_pq(Q, codes, offsets, books),
            "new batch validate=False": lambda: maxsim_pq(Q, _renewed(codes), _renewed(offsets),
                                                          books, validate=False),
            "new batch validate=True": lambda: maxsim_pq(Q, _renewed(codes), _renewed(offsets),
                                                         books),
            "inference tensors validate=False": lambda: maxsim_pq(Q, codes_inf, offsets_inf,
                                                                  books_inf, validate=False),
            "inference tensors": lambda: maxsim_pq(Q, codes_inf, offsets_inf, books_inf)}),
        dict(op="maxsim_pq", input=f"M={PQ_M} pids", ref=ref_pids, ways={
            "validate=False": lambda: maxsim_pq(Q, codes, offsets, books, pids, validate=False),
            "validate=True": lambda: maxsim_pq(Q, codes, offsets, books, pids),
            "new pids validate=False": lambda: maxsim_pq(Q, codes, offsets, books, new_pids(),
                                                         validate=False),
            "new pids validate=True": lambda: maxsim_pq(Q, codes, offsets, books, new_pids())}),
    ]


def baseline(way: str) -> str:
    """The way a row's ratio is taken against: the same call without validation (a new pid list,
    new documents or a new batch each call for those ways, the inference-mode copies for the inference way:
    a copy of the index lies elsewhere in memory, which alone can move its time), else the same
    tensors without validation."""
    for new in ("new pids", "new documents", "new batch"):
        if way.startswith(new):
            return f"{new} validate=False"
    return "inference tensors validate=False" if way == "inference tensors" else "validate=False"


def host_ms(fn, device, calls: int | None = None) -> float:
    """ms of the host's work per call: each of ``calls`` (default LOOP_CALLS) calls timed alone
    from an idle GPU (synchronised before it, not after), so a call's time is its Python and
    launches, and for a checked call its wait for its own check kernels (nothing else is
    queued ahead of them). A checked call is read before it returns, so the host runs at most
    one call ahead: where this passes the kernel's time, the GPU idles between calls and a
    loop of calls takes the host's time, not the kernel's."""
    calls = calls or LOOP_CALLS
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    total = 0.0
    for _ in range(calls):
        sync()
        start = time.perf_counter()
        fn()
        total += time.perf_counter() - start
    sync()
    return total * 1e3 / calls


def loop_ms(fn, device, calls: int | None = None) -> float:
    """ms per call of ``calls`` (default LOOP_CALLS) calls back to back, one synchronisation at
    the end."""
    calls = calls or LOOP_CALLS
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) * 1e3 / calls


def profile(fn, device, calls: int = 20) -> str:
    """torch.profiler's table of ``calls`` calls of ``fn``: each operator's and kernel's time
    on the device and the host, per call (what a way adds beside the scoring kernel)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn()
    with torch_profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=14)


def host_profile(fn, device, calls: int | None = None, limit: int = 25) -> str:
    """cProfile's table of ``calls`` (default LOOP_CALLS) calls back to back: the host's time
    per Python function, waits included (a deferred check's wait is ``Event.synchronize``)."""
    import cProfile
    import io
    import pstats

    calls = calls or LOOP_CALLS
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(limit)
    return text.getvalue()


def check(entry: dict) -> None:
    """Every way scores as validate=False (flash-maxsim to tolerance), and that as the float64
    reference on the first CHECK_DOCS documents; raises otherwise."""
    want = entry["ways"]["validate=False"]()
    ref = entry["ref"].reshape(-1)
    err = max_relative_error(want.reshape(-1)[: ref.numel()], ref)
    if not err <= TOLERANCE:
        raise AssertionError(f"{entry['op']} {entry['input']}: max relative error {err:.2e}")
    for way, fn in entry["ways"].items():
        got = fn().reshape(-1).float()
        same = (torch.equal(got, want.reshape(-1)) if way != "flash_maxsim"
                else max_relative_error(got[: ref.numel()], ref) <= 2e-2)
        if not same:
            raise AssertionError(f"{entry['op']} {entry['input']} {way}: scores differ from validate=False")


def summarize(entries: list[dict], times: dict, loops: dict, hosts: dict,
              num_docs: int) -> list[dict]:
    """One row per input and way: the medians of its rounds so far, and their ratios to the
    way's baseline."""
    rows = []
    for i, entry in enumerate(entries):
        for way in entry["ways"]:
            base = baseline(way)
            ms, loop = statistics.median(times[(i, way)]), statistics.median(loops[(i, way)])
            rows.append({"suite": SUITE, "op": entry["op"], "input": entry["input"],
                         "shape": f"1q Lq={QUERY_LEN} d={DIM} N={num_docs} {entry['input']}",
                         "provider": way, "baseline": base, "ms": ms, "round_ms": times[(i, way)],
                         "loop_ms": loop, "round_loop_ms": loops[(i, way)],
                         "host_ms": statistics.median(hosts[(i, way)]),
                         "round_host_ms": hosts[(i, way)],
                         "ratio_to_baseline": ms / statistics.median(times[(i, base)]),
                         "loop_ratio_to_baseline": loop / statistics.median(loops[(i, base)]),
                         "num_docs": num_docs})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_validate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--num-docs", type=int, default=100_000)
    parser.add_argument("--centroids", type=int, default=1 << 16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--nbits", type=int, nargs="+", default=[1, 2, 4], choices=(1, 2, 4),
                        help="residual bit widths")
    parser.add_argument("--profile", action="store_true",
                        help="also print torch.profiler's device time per operator for each "
                             "way of every input (20 calls each)")
    parser.add_argument("--host-profile", action="store_true",
                        help="also print cProfile's host time per Python function for each way "
                             f"of every input ({LOOP_CALLS} calls each)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="results/validate")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    device = torch.device(args.device)
    time_fn = _timer(device)
    g = torch.Generator().manual_seed(0)
    build = {"packed": lambda: packed_inputs(args.num_docs, device, g),
             "padded": lambda: padded_inputs(args.num_docs, device, g),
             "residual": lambda: [e for nbits in args.nbits for e in
                                  residual_inputs(args.num_docs, args.centroids, nbits, device, g)],
             "pq": lambda: pq_inputs(args.num_docs, device, g)}
    entries = [e for op in OPS if op in args.ops for e in build[op]()]
    for entry in entries:
        check(entry)
        print(f"checked {entry['op']} {entry['input']}: {', '.join(entry['ways'])}", flush=True)
    times = {(i, way): [] for i, e in enumerate(entries) for way in e["ways"]}
    loops = {key: [] for key in times}
    hosts = {key: [] for key in times}
    meta = {"argv": sys.argv if argv is None else argv, "rounds": args.rounds}
    for r in range(args.rounds):
        for i, entry in enumerate(entries):
            for way in harness.round_order(list(entry["ways"]), r):
                fn = entry["ways"][way]
                times[(i, way)].append(time_fn(fn)[0])
                loops[(i, way)].append(loop_ms(fn, device))
                hosts[(i, way)].append(host_ms(fn, device))
        # Written after every round, so a run stopped early keeps the rounds it finished.
        rows = summarize(entries, times, loops, hosts, args.num_docs)
        path = harness.write_results(rows, args.out, SUITE, meta={**meta, "rounds_done": r + 1})
        print(f"round {r + 1}/{args.rounds} done ({path})", flush=True)
    if args.profile:
        for entry in entries:
            for way, fn in entry["ways"].items():
                print(f"\n== profile {entry['op']} {entry['input']} {way}\n{profile(fn, device)}",
                      flush=True)
    if args.host_profile:
        for entry in entries:
            for way, fn in entry["ways"].items():
                print(f"\n== host profile {entry['op']} {entry['input']} {way}\n"
                      f"{host_profile(fn, device)}", flush=True)
    print(f"\n{'op':<16} {'input':<22} {'way':<24} {'ms':>8} {'ratio':>6} {'loop ms':>8} {'ratio':>6} "
          f"{'host ms':>8}")
    for row in rows:
        print(f"{row['op']:<16} {row['input']:<22} {row['provider']:<24} {row['ms']:>8.4f} "
              f"{row['ratio_to_baseline']:>6.3f} {row['loop_ms']:>8.4f} {row['loop_ratio_to_baseline']:>6.3f} "
              f"{row['host_ms']:>8.4f}")
    print("host ms: a call's host work from an idle GPU; a checked way whose host ms passes its "
          "baseline's ms leaves the GPU idle between calls (host_ms)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
