"""Where a rerank's scoring time goes: the part that grows with the candidates, and the part that does not.

    python -m experiments.profile_rerank [--sizes 100000 1000000] [--num-docs 1000000]
        [--num-centroids 65536] [--nbits 2]

The plugin's stage 4 (``backends.exact_scores``, the path ``rank(pids=...)`` takes) on a random
residual index of MS MARCO-like lengths (``bench_compressed.make_index``: C = 65,536 and
nbits = 2 unless --num-centroids / --nbits, d = 128, fp16-valued bucket weights as colbert-ai's GPU codec holds them), one 32-token fp32
query, ``size`` random pids. For each size it prints:

* the call's median time from Python and replayed as a CUDA graph;
* the GPU time of every kernel of one call (torch.profiler), so the fixed part (centroid table,
  query halves, decode table) is seen apart from the residual kernel;
* the centroid table's builds (cuBLAS fp32, our tf32x3 kernel, and the fp16 head + tail build
  that also writes the query halves, which the plugin takes when the centroids are fp16 values),
  and the whole call with the cuBLAS table;
* the residual kernel alone at 1, 2 and 4 documents per program, the default's neighbours (more
  documents per program amortise a program's start but leave a longer last wave), each with one
  program per chunk of documents and with a persistent grid that hands chunks out by an atomic
  counter (``ResidualConfig.persistent``), which has no last wave.

The last table compares each size's time per 100k candidates: the issue asks for the 100k call to
run within 10 % of the 1M call's throughput.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from .bench_compressed import make_index, queries
from .harness import graph_replay_ms, provenance, provenance_line, time_ms
from tilemaxsim_plaid.codecs.residual import bucket_table, residual_inverse_norms
from tilemaxsim_plaid.plaid import backends
from tilemaxsim_plaid.plaid.device_index import DeviceIndex
from tilemaxsim_plaid.ops.residual import (
    default_residual_config,
    maxsim_residual,
    query_centroid_scores,
    split_query_centroid_scores,
)

QUERY_LEN, DIM, NBITS, NUM_CENTROIDS = 32, 128, 2, 65_536


def random_device_index(num_docs: int, device: torch.device, num_centroids: int = NUM_CENTROIDS,
                        nbits: int = NBITS) -> DeviceIndex:
    """A DeviceIndex over random codes, with what stage 4 reads; no IVF (a rerank needs none)."""
    parts = make_index(num_docs, num_centroids, DIM, nbits, device)
    offsets = parts["offsets"]
    doclens = offsets[1:] - offsets[:-1]
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    # colbert-ai's GPU codec holds bucket weights in fp16: make them fp16 values.
    weights = parts["bucket_weights"].half().float()
    inv_norms = residual_inverse_norms(parts["codes"], parts["residuals"], parts["centroids"],
                                       weights, nbits)
    return DeviceIndex(
        device=device, codes=parts["codes"], residuals=parts["residuals"], offsets=offsets,
        doclens=doclens, centroids=parts["centroids"].float(), bucket_weights=weights,
        bucket_table=bucket_table(nbits, device).to(torch.uint8),
        ivf_pids=empty.int(), ivf_offsets=torch.zeros(1, dtype=torch.int64, device=device),
        ivf_lengths=empty, dim=DIM, nbits=nbits, num_docs=num_docs,
        num_tokens=parts["codes"].numel(), max_doclen=int(doclens.max()), max_ivf_length=0,
        ivf_lengths_desc_cumsum=torch.zeros(0, dtype=torch.int64), source_key=("random", num_docs),
        inv_norms=inv_norms.float(), bucket_weights_in_fp16=True,
        centroids_half=parts["centroids"].half())


def kernel_times(fn, calls: int = 5) -> list[tuple[str, float]]:
    """(kernel name, GPU microseconds per call), longest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / calls) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda row: -row[1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.profile_rerank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--num-docs", type=int, default=1_000_000)
    parser.add_argument("--num-centroids", type=int, default=NUM_CENTROIDS,
                        help="C; MS MARCO's full index has 262,144")
    parser.add_argument("--nbits", type=int, choices=(1, 2, 4), default=NBITS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_rerank times GPU kernels and needs a CUDA device")
    device = torch.device("cuda")
    index = random_device_index(args.num_docs, device, args.num_centroids, args.nbits)
    print(f"== index: {args.num_docs} documents, C = {args.num_centroids}, nbits = {args.nbits}, "
          f"d = {DIM}", flush=True)
    Q = queries(1, QUERY_LEN, DIM, device)[0].float()
    generator = torch.Generator().manual_seed(0)
    summary = []
    for size in args.sizes:
        pids = torch.randint(0, args.num_docs, (size,), generator=generator).to(device)

        def call():
            return backends.exact_scores(index, Q, pids)

        call()
        torch.cuda.synchronize()
        ms, graph = time_ms(call, warmup_ms=30, rep_ms=300)[0], graph_replay_ms(call)
        print(f"== {size} candidates, products {backends.products_for(index, QUERY_LEN)}: "
              f"{ms:.4f} ms from Python, {graph:.4f} ms as a graph", flush=True)
        for name, us in kernel_times(call)[:8]:
            print(f"   {us:9.1f} us  {name[:90]}")
        table = backends.centroid_table(index, Q)
        if size == args.sizes[0]:
            table_builds = {
                "cuBLAS fp32 (centroids @ Q.T)": lambda: backends.centroid_table(index, Q),
                "tf32x3 Triton": lambda: query_centroid_scores(Q[None], index.centroids),
                "fp16 head + tail, with the query halves": lambda: split_query_centroid_scores(
                    Q[None], index.centroids_half),
            }
            for name, fn in table_builds.items():
                print(f"   centroid table, {name}: {time_ms(fn, warmup_ms=30, rep_ms=200)[0] * 1e3:.1f} us")
        # The whole call with the table from cuBLAS (and the query split by torch), as before
        # the split table build: the fixed part it removes.
        cublas_table = dataclasses.replace(index, centroids_half=None)
        ms_cublas = time_ms(lambda: backends.exact_scores(cublas_table, Q, pids),
                            warmup_ms=30, rep_ms=300)[0]
        print(f"   whole call with the cuBLAS table: {ms_cublas:.4f} ms")
        base = default_residual_config(1, QUERY_LEN, True, size)
        for docs in (1, 2, 4):
            for persistent in (False, True):
                cfg = dataclasses.replace(base, docs_per_program=docs, persistent=persistent)
                kernel_ms = time_ms(lambda cfg=cfg: maxsim_residual(
                    Q[None], index.codes, index.residuals, index.offsets, index.centroids,
                    index.bucket_weights, args.nbits, pids, inv_norms=index.inv_norms,
                    centroid_scores=table, split_query=True, config=cfg, validate=False),
                    warmup_ms=30, rep_ms=300)[0]
                grid = "persistent grid" if persistent else "one program per chunk"
                print(f"   residual kernel alone, {docs} documents per program, {grid}: "
                      f"{kernel_ms:.4f} ms")
        summary.append((size, ms, graph))
    print(f"\n{'candidates':>10} {'ms':>9} {'graph ms':>9} {'ms per 100k':>12} {'M cand/s':>9}")
    for size, ms, graph in summary:
        print(f"{size:>10} {ms:>9.4f} {graph:>9.4f} {ms * 1e5 / size:>12.4f} {size / ms / 1e3:>9.1f}")
    print(provenance_line(provenance(), {}))


if __name__ == "__main__":
    main()
