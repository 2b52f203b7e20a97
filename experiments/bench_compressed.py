"""Compressed-index MaxSim benchmark: residual codes (PLAID) and PQ codes against dense scoring.

    tilemaxsim bench-compressed [--quick] [--sweep] [--out results/bench_compressed]

Shape (the issue's): one 32-token query, N = 100k candidate documents with MS MARCO-like lengths
(the clipped log-normal of experiments/bench.py: median 66, sigma 0.35, clipped to [8, 180],
mean ~70), C = 65,536 unit centroids, nbits = 2 (``--num-centroids``, ``--nbits``), d = 128,
codes uniform over the centroids (the worst case for L2 locality of centroid-side gathers).

Providers:
* tilemaxsim_residual: maxsim_residual with the index's precomputed inverse norms (centroid part
  from the per-query table, fp16 for the fp16 query).
* tilemaxsim_residual_fp32_table: the same with an fp32 table and no prefetch.
* tilemaxsim_residual_pairs: the default configuration with decode="pairs" (weights by pair-table
  loads from L1 instead of byte permutes from registers; the former default).
* tilemaxsim_residual_gather: maxsim_residual without norms (centroid rows gathered, norm taken
  from the decoded tile).
* tilemaxsim_dense_decoded: our dense maxsim_packed on the same documents decompressed to fp16.
* torch_decompress_score: decompress_residuals (colbert-ai's batched decode) then D @ Q^T and a
  segment max: what colbert-ai's stage 4 does on a GPU.
* tilemaxsim_pq_M16 / _M32: maxsim_pq on PQ codes (trained with torch k-means on 64k decoded
  tokens) of the decoded embeddings, default config: on a GPU with NVRTC, M = 16 is the CUDA
  tensor-core kernel (scoring="mma", kernels/maxsim_pq_mma.cu), M = 32 the Triton kernel.
* late_interaction_kernels: plaid.maxsim_residual_varlen, when importable, on the same codes with
  each residual byte bit-reversed (its layout reads slot s at bit s * nbits with the bucket's bits
  in order; colbert-ai's is the mirror image), after checking its scores agree with ours.

Before timing, every provider of ours is checked on the GPU against the float64 reference on fresh
random inputs, and on the benchmark data against the others. Bytes per document count what the
kernel must read from HBM: per-token streams, plus per-call tables amortised over the documents.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import harness, residual_floors
from .bench import msmarco_like_lengths
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.codecs.pq import PQCodec
from tilemaxsim_plaid.codecs.residual import (
    decompress_residuals,
    residual_inverse_norms,
)
from tilemaxsim_plaid.ops.dense import maxsim_packed
from tilemaxsim_plaid.ops.pq import PQConfig, maxsim_pq
from tilemaxsim_plaid.ops.residual import (ResidualConfig, default_residual_config,
                                           maxsim_residual, query_centroid_scores)

SUITE = "compressed"
OURS = "tilemaxsim_residual"
NUM_DOCS, NUM_CENTROIDS, QUERY_LEN, DIM, NBITS = 100_000, 65_536, 32, 128, 2
PQ_SUBQUANTIZERS = (16, 32)
# k-means sample for the PQ codebooks: faiss's default cap of 256 points per centroid.
PQ_TRAIN_TOKENS = 256 * 256
# Same tolerances as tests/tolerances.py for fp16 ("maxsim_residual", "maxsim_pq", "maxsim_dense").
CHECK_RTOL, CHECK_ATOL = 1e-3, 1e-3
# 8-bit reversal: turns colbert-ai's residual bytes into late-interaction-kernels' layout.
BITREV8 = torch.tensor([int(f"{b:08b}"[::-1], 2) for b in range(256)], dtype=torch.uint8)


def make_index(num_docs: int, num_centroids: int, dim: int, nbits: int, device, seed: int = 0):
    """Random residual-coded index: codes uniform over unit centroids, random residual bytes."""
    g = torch.Generator().manual_seed(seed)
    lengths = msmarco_like_lengths(num_docs, g)
    offsets = torch.zeros(num_docs + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    T = int(offsets[-1])
    centroids = F.normalize(torch.randn(num_centroids, dim, generator=g), dim=-1).half()
    # Sorted and centred like colbert-ai's bucket quantiles of the residual distribution.
    weights = torch.sort(torch.randn(1 << nbits, generator=g) * 0.03).values
    codes = torch.randint(0, num_centroids, (T,), generator=g, dtype=torch.int32)
    residuals = torch.randint(0, 256, (T, dim * nbits // 8), generator=g, dtype=torch.uint8)
    index = dict(codes=codes, residuals=residuals, offsets=offsets, centroids=centroids,
                 bucket_weights=weights)
    index = {k: v.to(device) for k, v in index.items()}
    index["inv_norms"] = residual_inverse_norms(index["codes"], index["residuals"],
                                                index["centroids"], index["bucket_weights"], nbits)
    index["lengths"] = lengths.to(device)
    index["nbits"] = nbits
    return index


def queries(B: int, Lq: int, dim: int, device, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(B, Lq, dim, generator=g), dim=-1).half().to(device)


def _timer(device):
    if device.type == "cuda":
        return harness.time_ms

    def cpu_time(fn, warmup_ms=0, rep_ms=0):
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        return times[1], times[0], times[-1]

    return cpu_time


def _close(out, ref) -> float:
    """Max abs difference on finite entries; raises if -inf patterns or values disagree."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if not torch.equal(torch.isfinite(out), torch.isfinite(ref)) or torch.isnan(out).any():
        raise AssertionError("non-finite entries differ from the reference")
    torch.testing.assert_close(out, ref, rtol=CHECK_RTOL, atol=CHECK_ATOL)
    finite = torch.isfinite(ref)
    return float((out - ref)[finite].abs().max()) if finite.any() else 0.0


def check_against_reference(device) -> dict:
    """Fresh random inputs (odd lengths, an empty document, Lq = 31, d = 96/128/384) vs float64."""
    report = {}
    for dim in (96, 128, 384):
        for nbits in (1, 2, 4):
            idx = make_index(40, 300, dim, nbits, device, seed=dim + nbits)
            idx["offsets"][5] = idx["offsets"][4]  # document 4 becomes empty...
            Q = queries(2, 31, dim, device, seed=dim)
            args = (Q, idx["codes"], idx["residuals"], idx["offsets"], idx["centroids"],
                    idx["bucket_weights"], nbits)
            ref = reference.maxsim_residual(*args)
            # ...which is why the norms are recomputed: the token ranges moved.
            norms = residual_inverse_norms(idx["codes"], idx["residuals"], idx["centroids"],
                                           idx["bucket_weights"], nbits)
            report[f"residual d={dim} nbits={nbits} table"] = _close(
                maxsim_residual(*args, inv_norms=norms), ref)
            report[f"residual d={dim} nbits={nbits} gather"] = _close(maxsim_residual(*args), ref)
        for M in (16, 32):
            if dim % M:
                continue
            g = torch.Generator().manual_seed(M)
            T = int(idx["offsets"][-1])
            books = (torch.randn(M, 256, dim // M, generator=g) / dim**0.5).to(device)
            codes = torch.randint(0, 256, (T, M), generator=g, dtype=torch.uint8).to(device)
            report[f"pq d={dim} M={M}"] = _close(
                maxsim_pq(Q, codes, idx["offsets"], books),
                reference.maxsim_pq(Q, codes, idx["offsets"], books))
    return report


def torch_decompress_score(Q2, index, nbits):
    """colbert-ai's GPU stage 4 in torch: decode in 32k-token batches, normalise, score, reduce."""
    D = decompress_residuals(index["codes"], index["residuals"], index["centroids"],
                             index["bucket_weights"], nbits)
    sim = (D @ Q2.T).float()  # [T, Lq]
    token_max = torch.segment_reduce(sim, "max", lengths=index["lengths"], axis=0)
    return token_max.sum(-1)


def lik_provider(Q, index, nbits, max_len):
    if Q.device.type != "cuda":
        return None  # its launcher autotunes, which needs a GPU driver even under the interpreter
    try:
        from late_interaction_kernels.plaid import maxsim_residual_varlen
    except ImportError:
        return None
    residuals = BITREV8.to(index["residuals"].device)[index["residuals"].long()]
    cu_seqlens = index["offsets"].to(torch.int32)
    weights = index["bucket_weights"].float()

    def run():
        return maxsim_residual_varlen(Q, index["codes"], residuals, cu_seqlens, index["centroids"],
                                      weights, nbits, max_seqlen_d=max_len)

    return run


def classify_bound(row: dict, ceilings: dict) -> str:
    """What the numbers say bounds a kernel (an inference from the roofline, not a profile)."""
    pct_bw = row.get("pct_read_bw") or 0.0
    pct_tc = row.get("pct_bf16_peak") or 0.0
    if pct_bw >= 60:
        return "HBM bandwidth"
    if pct_tc >= 50:
        return "tensor cores"
    return {
        "tilemaxsim_residual": "decode arithmetic (bits->weights) + S-row gathers from L2",
        "tilemaxsim_residual_fp32_table": "decode arithmetic (bits->weights) + S-row gathers from L2",
        "tilemaxsim_residual_pairs": "decode arithmetic (bits->weights) + S-row gathers from L2",
        "tilemaxsim_residual_gather": "decode arithmetic + centroid-row gathers from L2",
        "torch_decompress_score": "materialised decode: extra HBM passes and launches",
        "late_interaction_kernels": "per-(query, doc) programs: decode repeated, low occupancy",
        "tilemaxsim_pq_M16": "issue latency at 16 warps/SM: 64 registers of held query, chains "
                             "of tensor-core products (ncu, scoring='mma': issue 47-51 %, L1 48 %, "
                             "DRAM 12 %)",
    }.get(row["provider"], "L1 wavefronts of the codebook gathers (ncu at M = 16: L1 data pipe 91 %, "
                           "banks 11 %, tensor pipe 31 %)"
          if "pq" in row["provider"] else "latency / occupancy")


def main_rows(args, device, ceilings) -> tuple[list[dict], dict]:
    num_docs = args.num_docs or (10_000 if args.quick else NUM_DOCS)
    num_centroids, nbits = args.num_centroids, args.nbits
    time_ms = _timer(device)
    index = make_index(num_docs, num_centroids, DIM, nbits, device)
    Q = queries(1, QUERY_LEN, DIM, device)
    Q2 = Q[0]
    T = int(index["offsets"][-1])
    max_len = int(index["lengths"].max())
    shape = f"1q N={num_docs // 1000}k mean{T / num_docs:.0f} C={num_centroids} nbits={nbits} d={DIM}"
    flops = 2.0 * QUERY_LEN * DIM * T
    nb = DIM * nbits // 8
    doc_offsets = num_docs * 8
    # Read C, write and read S: fp16 entries for fp16 queries (ops/residual.py, half_table).
    table_bytes = num_centroids * DIM * 2 + 2 * num_centroids * QUERY_LEN * 2
    table_bytes_fp32 = num_centroids * DIM * 2 + 2 * num_centroids * QUERY_LEN * 4
    bytes_of = {
        "tilemaxsim_residual": T * (4 + nb + 4) + doc_offsets + table_bytes,
        "tilemaxsim_residual_fp32_table": T * (4 + nb + 4) + doc_offsets + table_bytes_fp32,
        "tilemaxsim_residual_pairs": T * (4 + nb + 4) + doc_offsets + table_bytes,
        "tilemaxsim_residual_gather": T * (4 + nb) + doc_offsets + num_centroids * DIM * 2,
        "torch_decompress_score": T * (4 + nb) + doc_offsets + num_centroids * DIM * 2,
        "late_interaction_kernels": T * (4 + nb) + doc_offsets + num_centroids * DIM * 2,
        "tilemaxsim_dense_decoded": T * DIM * 2 + doc_offsets,
    }
    residual_args = (Q2, index["codes"], index["residuals"], index["offsets"], index["centroids"],
                     index["bucket_weights"], nbits)
    runs = {
        "tilemaxsim_residual": lambda: maxsim_residual(*residual_args, inv_norms=index["inv_norms"],
                                                       validate=False),
        "tilemaxsim_residual_gather": lambda: maxsim_residual(*residual_args, validate=False),
        # An fp32 centroid-score table, no prefetch (the default before the fp16 table).
        "tilemaxsim_residual_fp32_table": lambda: maxsim_residual(
            *residual_args, inv_norms=index["inv_norms"], validate=False,
            config=dataclasses.replace(default_residual_config(1, QUERY_LEN, num_docs=num_docs),
                                       half_table=False)),
        "tilemaxsim_residual_pairs": lambda: maxsim_residual(
            *residual_args, inv_norms=index["inv_norms"], validate=False,
            config=dataclasses.replace(default_residual_config(1, QUERY_LEN, num_docs=num_docs,
                                                               half_table=True),
                                       decode="pairs")),
    }
    D16 = decompress_residuals(index["codes"], index["residuals"], index["centroids"],
                               index["bucket_weights"], nbits)
    runs["tilemaxsim_dense_decoded"] = lambda: maxsim_packed(Q2, D16, index["offsets"],
                                                             max_doc_len=max_len, validate=False)
    runs["torch_decompress_score"] = lambda: torch_decompress_score(Q2, index, nbits)
    sample = D16[torch.randperm(T, device=device)[:PQ_TRAIN_TOKENS]].float()
    pq_data = {}
    for M in PQ_SUBQUANTIZERS:
        codec = PQCodec.train(sample, M, niter=10, backend="torch")
        pq_data[M] = (codec.encode(D16), codec.codebooks)
        name = f"tilemaxsim_pq_M{M}"
        runs[name] = (lambda c=pq_data[M][0], b=pq_data[M][1]:
                      maxsim_pq(Q2, c, index["offsets"], b, validate=False))
        bytes_of[name] = T * M + doc_offsets + 256 * DIM * 2
    lik = lik_provider(Q2, index, nbits, max_len)
    if lik is not None:
        runs["late_interaction_kernels"] = lik

    # Cross-checks on the benchmark data: fused scores equal dense scores of the fp16 decode.
    checks = {}
    dense = runs["tilemaxsim_dense_decoded"]()
    for name in ("tilemaxsim_residual", "tilemaxsim_residual_fp32_table",
                 "tilemaxsim_residual_pairs", "tilemaxsim_residual_gather", "torch_decompress_score", "late_interaction_kernels"):
        if name in runs:
            diff = (runs[name]().double() - dense.double()).abs().max().item()
            checks[f"{name} vs dense(decoded fp16) max|diff|"] = diff
    if checks["tilemaxsim_residual vs dense(decoded fp16) max|diff|"] > 0.05:
        raise AssertionError(f"fused residual scores disagree with the decoded ones: {checks}")

    rows = []
    for name, fn in runs.items():
        timing = time_ms(fn)
        row = harness.make_row(SUITE, shape, name, timing, num_docs=num_docs,
                               nbytes=bytes_of[name], flops=flops, ceilings=ceilings,
                               bytes_per_doc=bytes_of[name] / num_docs,
                               bytes_per_token=bytes_of[name] / T)
        row["bound"] = classify_bound(row, ceilings)
        rows.append(row)
    rows += floor_rows(shape, Q, index, bytes_of["tilemaxsim_residual"] - table_bytes, num_docs,
                       ceilings, time_ms)
    dense_row = next(r for r in rows if r["provider"] == "tilemaxsim_dense_decoded")
    for row in rows:
        row["docs_per_s_vs_dense"] = row["docs_per_s"] / dense_row["docs_per_s"]
        row["bytes_vs_dense"] = dense_row["bytes"] / row["bytes"]
    harness.add_speedups(rows, OURS)
    if args.sweep:
        rows += sweep_rows(shape, Q2, index, pq_data, bytes_of, flops, num_docs, ceilings, time_ms)
    return rows, checks


def floor_rows(shape, Q, index, nbytes, num_docs, ceilings, time_ms) -> list[dict]:
    """experiments/residual_floors.py on the benchmark index: for each stage (read; + S-row
    gathers; + decode) the fastest launch configuration, each checked against float64 torch."""
    scores = query_centroid_scores(Q, index["centroids"])
    args = (index["codes"], index["residuals"], index["inv_norms"], index["offsets"], scores,
            index["bucket_weights"], index["nbits"])
    rows = []
    for stage in residual_floors.STAGES:
        expected = residual_floors.expected_floor(stage, *args)
        timing, (block_t, warps) = harness.fastest(
            residual_floors.CONFIGS,
            lambda c: residual_floors.residual_floor(stage, *args, block_t=c[0], num_warps=c[1]),
            lambda out: torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-2),
            time_ms)
        row = harness.make_row(SUITE, shape, f"floor_{stage}", timing, num_docs=num_docs,
                               nbytes=nbytes, flops=0.0, ceilings=ceilings,
                               bytes_per_doc=nbytes / num_docs, config=f"block_t={block_t} warps={warps}")
        row["bound"] = {"read": "reading codes, residual words and norms",
                        "gather": "+ S-row gathers from L2",
                        "decode": "+ pair decode of every residual word"}[stage]
        rows.append(row)
    return rows


def residual_sweep_configs() -> list[ResidualConfig]:
    """Each decoder x num_warps {2, 4} x main tile {16, 32, 64} x num_stages {1, 3} (24 configs),
    plus, around the small-set default, several documents per program, a 32-token tail and
    register caps (ptxas .maxnreg) that trade a few spills for more programs per SM (5 more),
    and one-warp programs around the large-set default (1 warp, cap 96, 4 documents; 5 more)."""
    configs = [ResidualConfig(decode=decode, num_warps=warps, block_t=block_t, num_stages=stages)
               for decode in ("pairs", "select") for warps in (2, 4) for block_t in (16, 32, 64)
               for stages in (1, 3)]
    default = ResidualConfig()
    configs += [dataclasses.replace(default, docs_per_program=4),
                dataclasses.replace(default, block_t=32, block_t_tail=32),
                dataclasses.replace(default, block_t=32, maxnreg=128),
                dataclasses.replace(default, block_t=16, maxnreg=80),
                dataclasses.replace(default, block_t=64, block_t_tail=32, num_warps=4)]
    configs += [ResidualConfig(num_warps=1, maxnreg=reg, docs_per_program=docs)
                for reg, docs in ((None, 1), (96, 1), (96, 2), (96, 4), (112, 4))]
    return configs


# PQ around its best configs of the third H200 run (32-token tiles, 16 documents per program).
PQ_SWEEP = [PQConfig(block_t=block_t, block_t_tail=16, docs_per_program=docs, num_warps=warps)
            for block_t in (32, 64) for docs in (4, 16) for warps in (2, 4)]


def _config_label(cfg, fields) -> str:
    return " ".join(f"{name}={getattr(cfg, name)}" for name in fields)


def sweep_rows(shape, Q2, index, pq_data, bytes_of, flops, num_docs, ceilings, time_ms) -> list[dict]:
    """Time a grid of launch configs of the residual and PQ kernels (to pick the defaults)."""
    rows = []
    residual_args = (Q2, index["codes"], index["residuals"], index["offsets"], index["centroids"],
                     index["bucket_weights"], index["nbits"])
    residual_fields = ("decode", "block_t", "block_t_tail", "docs_per_program", "num_warps",
                       "num_stages", "maxnreg")
    expected = maxsim_residual(*residual_args, inv_norms=index["inv_norms"])
    for cfg in residual_sweep_configs():
        fn = (lambda c=cfg: maxsim_residual(*residual_args, inv_norms=index["inv_norms"],
                                            config=c, validate=False))
        # Each config must give the default's scores (those are checked against float64 torch
        # in check_against_reference) before it is timed.
        torch.testing.assert_close(fn(), expected, rtol=1e-3, atol=1e-3)
        rows.append(harness.make_row(
            SUITE + "-sweep", shape, f"residual {_config_label(cfg, residual_fields)}",
            time_ms(fn), num_docs=num_docs, nbytes=bytes_of[OURS], flops=flops,
            ceilings=ceilings))
    pq_fields = ("block_t", "block_t_tail", "docs_per_program", "num_warps")
    for M, (codes, books) in pq_data.items():
        for cfg in PQ_SWEEP:
            fn = (lambda c=cfg, codes=codes, books=books:
                  maxsim_pq(Q2, codes, index["offsets"], books, config=c, validate=False))
            rows.append(harness.make_row(
                SUITE + "-sweep", shape, f"pq{M} {_config_label(cfg, pq_fields)}", time_ms(fn),
                num_docs=num_docs, nbytes=bytes_of[f"tilemaxsim_pq_M{M}"], flops=flops,
                ceilings=ceilings))
    best = {}
    for row in rows:
        kind = row["provider"].split()[0]
        if kind not in best or row["ms"] < best[kind]["ms"]:
            best[kind] = row
    for kind, row in best.items():
        print(f"sweep best {kind}: {row['provider']} {row['ms']:.3f} ms")
    return rows


def plot_roofline(rows: list[dict], ceilings: dict, path: Path) -> Path | None:
    """Achieved TFLOP/s against FLOP per HBM byte, under the measured read and bf16 ceilings."""
    if not ceilings.get("read_gbps"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    bw_tbps = ceilings["read_gbps"] / 1e3
    peak = ceilings["bf16_tflops"]
    xs = [10 ** (k / 10) for k in range(-10, 41)]
    ax.plot(xs, [min(peak, bw_tbps * x) for x in xs], "k-", lw=1,
            label=f"ceilings: {ceilings['read_gbps']:.0f} GB/s read, {peak:.0f} TFLOP/s bf16")
    # The residual and PQ points sit close together: a legend entry per provider (with its
    # time) reads better than labels written over each other.
    markers = "osD^v<>ph*"
    for k, row in enumerate(r for r in rows if r["suite"] == SUITE and r["tflops"]):
        intensity = row["tflops"] * 1e12 / (row["gbps"] * 1e9)  # the floors do no products
        ax.scatter(intensity, row["tflops"], s=30, marker=markers[k % len(markers)],
                   label=f"{row['provider'].replace('tilemaxsim_', '')} ({row['ms']:.3f} ms)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte read (tensor-core-equivalent 2*Lq*d per token)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("MaxSim over compressed documents: roofline")
    # Beside the axes, where it hides no point.
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path


def print_summary(rows: list[dict]) -> None:
    print(f"\n{'provider':<30} {'ms':>8} {'Mdoc/s':>8} {'B/doc':>8} {'GB/s':>7} "
          f"{'xdense':>7} {'bytes/':>7}  bound")
    for row in rows:
        if row["suite"] != SUITE:
            continue
        print(f"{row['provider']:<30} {row['ms']:>8.3f} {row['docs_per_s'] / 1e6:>8.1f} "
              f"{row['bytes_per_doc']:>8.0f} {row['gbps']:>7.0f} {row['docs_per_s_vs_dense']:>7.2f} "
              f"{row['bytes_vs_dense']:>6.1f}x  {row['bound']}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="tilemaxsim bench-compressed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 10k documents")
    parser.add_argument("--num-docs", type=int, default=0, help="override N")
    parser.add_argument("--num-centroids", type=int, default=NUM_CENTROIDS)
    parser.add_argument("--nbits", type=int, choices=(1, 2, 4), default=NBITS,
                        help="residual bits per dimension of the benchmark index")
    parser.add_argument("--sweep", action="store_true", help="also time a grid of kernel configs")
    parser.add_argument("--skip-check", action="store_true",
                        help="skip the float64 reference check (never for published numbers)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu runs a smoke test under TRITON_INTERPRET=1 (no meaningful times)")
    parser.add_argument("--out", default="results/bench_compressed")
    parser.add_argument("--plot-from", metavar="JSON",
                        help="only redraw the roofline of a written bench_compressed.json, beside it")
    args = parser.parse_args(argv)
    if args.plot_from:
        results = json.loads(Path(args.plot_from).read_text())
        plot = plot_roofline(results["rows"], results["ceilings"],
                             Path(args.plot_from).with_name("roofline_compressed.png"))
        print(f"wrote {plot}" if plot else "no read ceiling in that file: nothing to plot")
        return
    device = torch.device(args.device)
    if device.type == "cuda":
        ceilings = harness.measure_ceilings()
        print("ceilings:", json.dumps({k: round(v, 1) for k, v in ceilings.items()}))
    else:
        ceilings = {}
    print("provenance:", json.dumps(harness.provenance()))
    reference_check = {} if args.skip_check else check_against_reference(device)
    if reference_check:
        print(f"reference check: {len(reference_check)} cases OK, max |diff| "
              f"{max(reference_check.values()):.2e}")
    rows, cross_checks = main_rows(args, device, ceilings)
    for name, value in cross_checks.items():
        print(f"cross-check: {name} = {value:.3e}")
    out_dir = Path(args.out)
    path = harness.write_results(rows, out_dir, "bench_compressed", ceilings=ceilings,
                                 meta={"reference_check": reference_check,
                                       "cross_checks": cross_checks,
                                       "lengths": "clipped log-normal (median 66, sigma 0.35, "
                                                  "[8, 180]), experiments/bench.py"})
    plot = plot_roofline(rows, ceilings, out_dir / "roofline_compressed.png")
    print(f"wrote {path}" + (f" and {plot}" if plot else ""))
    harness.print_table([r for r in rows if r["suite"] == SUITE], ours=OURS)
    print_summary(rows)


if __name__ == "__main__":
    main()
