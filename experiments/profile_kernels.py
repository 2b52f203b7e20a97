"""Where the default kernels spend their time: interleaved timing and Nsight Compute.

Every op is called the way a user calls it, through its public function with ``config=None``
(the default configuration for the input), on the benchmark's shapes: 100k documents of MS
MARCO-like lengths, 32 query tokens, d = 128; residual codes with C = 65,536 and nbits = 2; PQ
codes with M = 16 and 32.

    python -m experiments.profile_kernels time [--rounds 10]
        times every entry below in rounds, one after another within a round, so clock and
        thermal drift hit them all alike; prints each entry's median over rounds.
    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python -m experiments.profile_kernels profile
        runs each entry once (after a warm-up launch) between cudaProfilerStart/Stop, so Nsight
        Compute sees exactly one launch per entry.

Every entry's output is checked against the float64 reference before it is timed or profiled.
Beside our ops: flash-maxsim's packed kernel when installed, and the per-document floors that
say what the hardware allows (experiments/packed_read.py, experiments/residual_floors.py).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from . import harness
from .bench import CHECK_DOCS, Case, make_inputs, max_relative_error, reference_slice
from .bench_compressed import NBITS, make_index, queries
from .packed_read import expected_read, per_document_read
from .residual_floors import expected_floor, residual_floor
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.dense import maxsim_packed, maxsim_padded
from tilemaxsim_plaid.ops.pq import maxsim_pq
from tilemaxsim_plaid.ops.residual import maxsim_residual, query_centroid_scores

NUM_DOCS = 100_000
QUERY_LEN = 32
DIM = 128
NUM_CENTROIDS = 65_536
# Padded documents of this many tokens (the dense benchmark's padded headline shape).
PADDED_LEN = 128


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 2e-3) -> None:
    err = max_relative_error(got, want)
    if not err <= tol:
        raise AssertionError(f"{name}: max relative error {err:.2e} > {tol:.0e}")


def dense_ops(num_docs: int = NUM_DOCS, device: str = "cuda") -> dict:
    """{name: (run, check)} for maxsim_packed and maxsim_padded at their defaults, flash-maxsim
    and the packed floors; check raises if run's output is wrong."""
    case = Case(f"1q packed N={num_docs} mean70 d=128", 1, QUERY_LEN, num_docs, 0, DIM, packed=True)
    x = make_inputs(case, device=device)
    Q = x.Q[0]
    max_len = int(x.lengths.max())
    ref = reference_slice(case, x)[0]  # float64, the first CHECK_DOCS documents
    n = ref.numel()
    ops = {"packed": (lambda: maxsim_packed(Q, x.D_packed, x.offsets, max_doc_len=max_len,
                                            validate=False),
                      lambda out: _assert_close("packed", out[:n], ref))}
    padded_case = Case(f"1q N={num_docs} Ld={PADDED_LEN} d=128", 1, QUERY_LEN, num_docs,
                       PADDED_LEN, DIM)
    xp = make_inputs(padded_case, device=device)
    ref_padded = reference_slice(padded_case, xp)[0]
    ops["padded"] = (lambda: maxsim_padded(xp.Q[0], xp.D, validate=False),
                     lambda out: _assert_close("padded", out[:ref_padded.numel()], ref_padded))
    try:
        import flash_maxsim
    except ImportError:
        flash_maxsim = None
    if flash_maxsim is not None and device != "cpu":
        cu = x.offsets.to(torch.int32)
        ops["flash_maxsim_packed"] = (
            lambda: flash_maxsim.flash_maxsim_packed(Q, x.D_packed, cu, max_seqlen_d=max_len),
            lambda out: _assert_close("flash_maxsim_packed", out.reshape(-1)[:n], ref))
    per_doc_sum = expected_read(x.D_packed, x.offsets)
    ops["floor read"] = (lambda: per_document_read(x.D_packed, x.offsets),
                         lambda out: _assert_close("floor read", out, per_doc_sum, 1e-2))
    ops["floor bare maxsim"] = (
        lambda: per_document_read(x.D_packed, x.offsets, query=Q, product=True),
        lambda out: _assert_close("floor bare maxsim", out[:n], ref))
    return ops


def wide_ops(num_docs: int = NUM_DOCS, device: str = "cuda") -> dict:
    """{name: (run, check)} for maxsim_packed at its defaults off the headline's one query of 32
    tokens: one query of 64 tokens (a 64-row query block), and 4 and 32 queries of 32 tokens
    sharing the documents (issue 25's tensor-ceiling cells)."""
    ops = {}
    for B, Lq in ((1, 64), (4, 32), (32, 32)):
        case = Case(f"{B}q packed N={num_docs} mean70 d=128 Lq={Lq}", B, Lq, num_docs, 0, DIM,
                    packed=True)
        x = make_inputs(case, device=device)
        max_len = int(x.lengths.max())
        ref = reference_slice(case, x).reshape(B, -1)
        Q = x.Q if B > 1 else x.Q[0]
        name = f"packed B{B} Lq{Lq}"
        ops[name] = (lambda Q=Q, x=x, max_len=max_len: maxsim_packed(
                         Q, x.D_packed, x.offsets, max_doc_len=max_len, validate=False),
                     lambda out, name=name, ref=ref: _assert_close(
                         name, out.reshape(ref.shape[0], -1)[:, :ref.shape[1]], ref))
    return ops


def residual_ops(num_docs: int = NUM_DOCS, device: str = "cuda",
                 num_centroids: int = NUM_CENTROIDS, wide_nbits: tuple = (4,)) -> dict:
    """{name: (run, check)} for maxsim_residual at its defaults: an fp16 query over every
    document, PLAID's rerank (an fp32 query, every document once in shuffled order) with both
    fp32 products the plugin uses (fp16x2 = split_query, tf32x3), and the decode floor; then the
    fp16 query at each of ``wide_nbits`` on documents of the same lengths."""
    device = torch.device(device)
    index = make_index(num_docs, num_centroids, DIM, NBITS, device)
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    args = (Q, index["codes"], index["residuals"], index["offsets"], index["centroids"],
            index["bucket_weights"], NBITS)
    n = min(CHECK_DOCS, num_docs)
    ref = reference.maxsim_residual(Q.cpu(), index["codes"].cpu(), index["residuals"].cpu(),
                                    index["offsets"][: n + 1].cpu(), index["centroids"].cpu(),
                                    index["bucket_weights"].cpu(), NBITS)
    ops = {"residual": (lambda: maxsim_residual(*args, inv_norms=index["inv_norms"],
                                                validate=False),
                        lambda out: _assert_close("residual", out[:n], ref))}
    Q32 = Q.float()
    pids = torch.randperm(num_docs, generator=torch.Generator().manual_seed(2)).to(device)
    ref_pids = reference.maxsim_residual(Q32.cpu(), index["codes"].cpu(), index["residuals"].cpu(),
                                         index["offsets"].cpu(), index["centroids"].cpu(),
                                         index["bucket_weights"].cpu(), NBITS, pids[:n].cpu())
    for products, split in (("fp16x2", True), ("tf32x3", False)):
        name = f"rerank {products}"
        ops[name] = (lambda split=split: maxsim_residual(
                         Q32, *args[1:], pids, inv_norms=index["inv_norms"], split_query=split,
                         validate=False),
                     lambda out, name=name: _assert_close(name, out[:n], ref_pids))
    scores = query_centroid_scores(Q[None], index["centroids"])
    floor_args = (index["codes"], index["residuals"], index["inv_norms"], index["offsets"], scores,
                  index["bucket_weights"], NBITS)
    floor_ref = expected_floor("decode", *floor_args)
    ops["residual floor decode"] = (lambda: residual_floor("decode", *floor_args),
                                    lambda out: torch.testing.assert_close(
                                        out.double(), floor_ref, rtol=1e-4, atol=1e-2))
    for nbits in wide_nbits:
        wide = make_index(num_docs, num_centroids, DIM, nbits, device)
        wide_args = (Q, wide["codes"], wide["residuals"], wide["offsets"], wide["centroids"],
                     wide["bucket_weights"], nbits)
        wide_ref = reference.maxsim_residual(Q.cpu(), *(t.cpu() for t in wide_args[1:3]),
                                             wide["offsets"][: n + 1].cpu(),
                                             *(t.cpu() for t in wide_args[4:6]), nbits)
        name = f"residual nbits{nbits}"
        ops[name] = (lambda a=wide_args, w=wide: maxsim_residual(*a, inv_norms=w["inv_norms"],
                                                                 validate=False),
                     lambda out, name=name, ref=wide_ref: _assert_close(name, out[:n], ref))
    return ops


def pq_ops(num_docs: int = NUM_DOCS, device: str = "cuda", subquantizers: tuple = (16, 32)) -> dict:
    """{name: (run, check)} for maxsim_pq at its defaults on the residual shape's documents:
    uniform random codes and codebooks (the gathers' addresses are as scattered as a trained
    codec's)."""
    device = torch.device(device)
    offsets = make_index(num_docs, 64, DIM, NBITS, device)["offsets"]
    num_tokens = int(offsets[-1])
    g = torch.Generator().manual_seed(3)
    Q = queries(1, QUERY_LEN, DIM, device)[0]
    n = min(CHECK_DOCS, num_docs)
    ops = {}
    for M in subquantizers:
        codes = torch.randint(0, 256, (num_tokens, M), generator=g, dtype=torch.uint8).to(device)
        books = (torch.randn(M, 256, DIM // M, generator=g) / DIM**0.5).to(device)
        ref = reference.maxsim_pq(Q.cpu(), codes.cpu(), offsets[: n + 1].cpu(), books.cpu())
        name = f"pq{M}"
        ops[name] = (lambda c=codes, b=books: maxsim_pq(Q, c, offsets, b, validate=False),
                     lambda out, name=name, ref=ref: _assert_close(name, out[:n], ref))
    return ops


def time_rounds(variants: dict, rounds: int, rep_ms: int) -> dict:
    """{name: [median ms of each round]}: every round times every entry once, in order."""
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (run, _check) in variants.items():
            times[name].append(harness.time_ms(run, rep_ms=rep_ms)[0])
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.profile_kernels",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("time", "profile"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rep-ms", type=int, default=50)
    parser.add_argument("--only", default="", help="comma-separated substrings of entry names "
                        "(a key starting with '=' is a whole name)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_kernels times GPU kernels and needs a CUDA device")
    variants = {**dense_ops(), **wide_ops(), **residual_ops(), **pq_ops()}
    if args.only:
        keys = [k.strip() for k in args.only.split(",")]
        variants = {n: v for n, v in variants.items()
                    if any(n == k[1:] if k.startswith("=") else k in n for k in keys)}
    for name, (run, check) in variants.items():
        check(run())  # also the warm-up (compile) launch
        print(f"checked {name}", flush=True)
    torch.cuda.synchronize()
    if args.mode == "profile":
        for name, (run, _check) in variants.items():
            torch.cuda.profiler.start()
            run()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"profiled {name}", flush=True)
        return
    times = time_rounds(variants, args.rounds, args.rep_ms)
    print(f"\n{'op':<28} {'median ms':>10} {'min':>8} {'max':>8}   ({args.rounds} rounds)")
    for name, values in times.items():
        print(f"{name:<28} {statistics.median(values):>10.4f} {min(values):>8.4f} {max(values):>8.4f}")


if __name__ == "__main__":
    main()
