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
    python -m experiments.profile_kernels ncu [--ops residual] [--only NAMES] --out DIR
        [--ncu PATH]
        the same under Nsight Compute, the scoring kernels only (not the centroid tables'):
        DIR/ncu.ncu-rep, its details page (ncu.csv) and a table of which unit each launch
        saturates (ncu_summary.txt, experiments/profile_batched's), and its source page, the
        warp-state samples per SASS instruction (source.csv), read into the instructions
        warps wait on most and why (stalls.txt).

Every entry's output is checked against the float64 reference before it is timed or profiled.
Beside our ops: flash-maxsim's packed kernel when installed, and the per-document floors that
say what the hardware allows (experiments/packed_read.py, experiments/residual_floors.py).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import statistics
import subprocess
from pathlib import Path

import torch

from . import harness, profile_batched
from .bench import CHECK_DOCS, Case, make_inputs, max_relative_error, reference_slice
from .bench_compressed import NBITS, make_index, queries
from .packed_read import expected_read, per_document_read
from .residual_floors import expected_floor, residual_floor
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops.dense import maxsim_packed, maxsim_padded
from tilemaxsim_plaid.ops.pq import maxsim_pq
from tilemaxsim_plaid.ops import nvrtc
from tilemaxsim_plaid.ops.residual import (MMA_NBITS, default_residual_config, maxsim_residual,
                                           query_centroid_scores)

NUM_DOCS = 100_000
QUERY_LEN = 32
DIM = 128
NUM_CENTROIDS = 65_536
# Padded documents of this many tokens (the dense benchmark's padded headline shape).
PADDED_LEN = 128
# Nsight Compute: profile_batched's sections, the schedulers' eligible warps, and the warp-state
# samples per SASS instruction; the ops' scoring kernels (Triton's and NVRTC's, named maxsim),
# not the centroid-score tables' or the checks'.
NCU_SECTIONS = (*profile_batched.NCU_SECTIONS, "SchedulerStats", "SourceCounters")
SCORING_KERNELS = "regex:maxsim"
# Where the profile run writes its entries in launch order, for the summary's labels.
PROFILED = "profiled.json"
# Instructions listed per kernel in stalls.txt, and stall reasons per instruction.
TOP_INSTRUCTIONS, TOP_REASONS = 25, 3


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
    fp16 query at each of ``wide_nbits`` on documents of the same lengths. On a GPU with NVRTC,
    where the default is the tensor-core kernel (MMA_NBITS), each fp16-query entry also as the
    Triton kernel's launch ("residual decode")."""
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
    mma = device.type == "cuda" and nvrtc.available()

    def triton_launch(nbits):
        return default_residual_config(1, QUERY_LEN, False, num_docs, Q.element_size(),
                                       half_table=True, nbits=nbits)

    if mma and NBITS in MMA_NBITS:
        ops["residual decode"] = (lambda: maxsim_residual(
                                      *args, inv_norms=index["inv_norms"],
                                      config=triton_launch(NBITS), validate=False),
                                  lambda out: _assert_close("residual decode", out[:n], ref))
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
        if mma and nbits in MMA_NBITS:
            name = f"residual decode nbits{nbits}"
            ops[name] = (lambda a=wide_args, w=wide, c=triton_launch(nbits): maxsim_residual(
                             *a, inv_norms=w["inv_norms"], config=c, validate=False),
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
    """{name: [median ms of each round]}: every round times every entry once, each round
    starting one entry further on (harness.round_order)."""
    return harness.rounds_ms({name: run for name, (run, _check) in variants.items()}, rounds,
                             lambda fn: harness.time_ms(fn, rep_ms=rep_ms))


# The entries' families, built only where asked for (--ops): each builds its index first.
OPS = {"dense": dense_ops, "wide": wide_ops, "residual": residual_ops, "pq": pq_ops}


def _families(text: str) -> str:
    unknown = [f for f in text.split(",") if f and f not in OPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown families {unknown} (of {', '.join(OPS)})")
    return text


# ---- Nsight Compute ----

def source_command(ncu: str, report: Path) -> list[str]:
    """The report's source page as CSV: a row per SASS instruction of each profiled launch, with
    its warp-state samples in all and by reason (the ``stall_*`` columns)."""
    return [ncu, "--import", f"{report}.ncu-rep", "--csv", "--page", "source",
            "--print-source", "sass"]


def source_blocks(text: str) -> list[tuple[str, list[dict]]]:
    """(title, rows) per launch of an ncu source-page CSV: a block starts at a header row naming
    "Address" and "Source"; its title is the short line before it (ncu's launch line), if any;
    its rows are the lines as long as the header."""
    blocks, header, previous = [], None, []
    for row in csv.reader(text.splitlines()):
        if "Address" in row and "Source" in row:
            header = row
            title = " ".join(c for c in previous if c) if 0 < len(previous) < 4 else ""
            blocks.append((title, []))
        elif header is not None and len(row) == len(header):
            blocks[-1][1].append(dict(zip(header, row)))
        previous = row
    return blocks


def _number(text) -> float:
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def _opcode(sass: str) -> str:
    tokens = sass.split()
    if tokens and tokens[0].startswith("@"):  # a predicate
        tokens = tokens[1:]
    return tokens[0].split(".")[0] if tokens else "?"


def stall_table(title: str, rows: list[dict], top: int = TOP_INSTRUCTIONS) -> str:
    """Where one launch's warps wait: its warp-state samples by opcode and by reason, then the
    ``top`` instructions by samples, each with its share, executions and leading reasons."""
    samples = next((c for c in (rows[0] if rows else ()) if c.startswith("Warp Stall Sampling (All")),
                   None)
    if samples is None:
        return f"== {title or 'launch'}: no warp-state samples on its source page"
    reasons = [c for c in rows[0] if c.startswith("stall_")]
    total = sum(_number(r[samples]) for r in rows)
    share = (lambda v: 100.0 * v / total) if total else (lambda v: 0.0)
    by_opcode, by_reason = collections.Counter(), collections.Counter()
    for r in rows:
        by_opcode[_opcode(r["Source"])] += _number(r[samples])
        for c in reasons:
            by_reason[c[len("stall_"):]] += _number(r[c])
    lines = [f"== {title or 'launch'}: {total:.0f} warp-state samples, {len(rows)} instructions",
             "by opcode: " + ", ".join(f"{o} {share(v):.1f}%" for o, v in by_opcode.most_common(10)),
             "by reason: " + (", ".join(f"{o} {share(v):.1f}%" for o, v in by_reason.most_common(8)
                                        if v) or "-"),
             f"{'address':>8} {'executed':>10} {'samples':>8}  {'reasons':<40} instruction"]
    for r in sorted(rows, key=lambda r: -_number(r[samples]))[:top]:
        leading = sorted(((c[len("stall_"):], _number(r[c])) for c in reasons), key=lambda kv: -kv[1])
        why = ", ".join(f"{n} {share(v):.1f}" for n, v in leading[:TOP_REASONS] if v)
        lines.append(f"{r['Address'][-8:]:>8} {r.get('Instructions Executed', ''):>10} "
                     f"{share(_number(r[samples])):>7.1f}%  {why:<40} {r['Source'].strip()[:100]}")
    return "\n".join(lines)


def write_summaries(out: Path) -> str:
    """ncu_summary.txt from the details page (ncu.csv: which unit each launch saturates, its top
    stall reasons) and stalls.txt from the source page (source.csv), each launch named by the
    profile run's entry (PROFILED) where the counts agree; returns both texts."""
    profiled = out / PROFILED
    launch_map = json.loads(profiled.read_text())["rows"] if profiled.exists() else None
    names = [m["cell"] for m in launch_map for _ in range(m["launches"])] if launch_map else []
    texts = []
    details = out / f"{profile_batched.NCU_REPORT}.csv"
    if details.exists():
        results = profile_batched.read_ncu_csv(details.read_text(errors="replace"))
        rows, note = profile_batched.summarize_rows(results, launch_map)
        texts.append(profile_batched.ncu_table(rows, note))
        (out / "ncu_summary.txt").write_text(texts[-1] + "\n")
    source = out / "source.csv"
    if source.exists():
        blocks = source_blocks(source.read_text(errors="replace"))
        labels = names if len(names) == len(blocks) else [title for title, _ in blocks]
        texts.append("\n\n".join(stall_table(label, rows) for label, (_, rows) in zip(labels, blocks))
                     or "no launches on the source page")
        (out / "stalls.txt").write_text(texts[-1] + "\n")
    return "\n\n".join(texts)


def run_ncu(args) -> int:
    """profile mode under ncu (profile_batched.run_ncu: the report and its details page), then
    the report's source page and the summaries."""
    out = Path(args.out)
    forwarded = (["--out", str(out)] + (["--ops", args.ops] if args.ops else [])
                 + (["--only", args.only] if args.only else []))
    rc = profile_batched.run_ncu(args, forwarded, module="experiments.profile_kernels",
                                 kernels=SCORING_KERNELS, sections=NCU_SECTIONS)
    report = out / profile_batched.NCU_REPORT
    if not Path(f"{report}.ncu-rep").exists():
        return rc or 1
    with open(out / "source.csv", "w") as f:
        exported = subprocess.run(source_command(args.ncu or profile_batched.find_ncu(), report),
                                  stdout=f).returncode
    print(write_summaries(out), flush=True)
    return rc or exported


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.profile_kernels",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("time", "profile", "ncu"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rep-ms", type=int, default=50)
    parser.add_argument("--only", default="", help="comma-separated substrings of entry names "
                        "(a key starting with '=' is a whole name)")
    parser.add_argument("--ops", default="", type=_families,
                        help=f"comma-separated families of entries to build ({', '.join(OPS)}; "
                        "default all)")
    parser.add_argument("--out", default=None,
                        help="ncu: the report's folder (default results/profile/kernels); "
                        f"profile: where to write the entries' launch order ({PROFILED})")
    parser.add_argument("--ncu", help="ncu: the Nsight Compute binary (default: found)")
    args = parser.parse_args(argv)
    if args.mode == "ncu":
        args.out = args.out or "results/profile/kernels"
        return run_ncu(args)
    if not torch.cuda.is_available():
        raise SystemExit("profile_kernels times GPU kernels and needs a CUDA device")
    families = args.ops.split(",") if args.ops else list(OPS)
    variants = {name: entry for family in families for name, entry in OPS[family]().items()}
    if args.only:
        keys = [k.strip() for k in args.only.split(",")]
        variants = {n: v for n, v in variants.items()
                    if any(n == k[1:] if k.startswith("=") else k in n for k in keys)}
    for name, (run, check) in variants.items():
        check(run())  # also the warm-up (compile) launch
        print(f"checked {name}", flush=True)
    torch.cuda.synchronize()
    if args.mode == "profile":
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, PROFILED).write_text(json.dumps(
                {"rows": [{"cell": name, "launches": 1} for name in variants]}, indent=1))
        for name, (run, _check) in variants.items():
            torch.cuda.profiler.start()
            run()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"profiled {name}", flush=True)
        return 0
    times = time_rounds(variants, args.rounds, args.rep_ms)
    print(f"\n{'op':<28} {'median ms':>10} {'min':>8} {'max':>8}   ({args.rounds} rounds)")
    for name, values in times.items():
        print(f"{name:<28} {statistics.median(values):>10.4f} {min(values):>8.4f} {max(values):>8.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
