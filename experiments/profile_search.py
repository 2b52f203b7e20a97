"""Where one PLAID search's time goes on the GPU, kernel by kernel, at a given corpus size.

    python -m experiments.profile_search --index PATH [--queries 64] [--out DIR]
    python -m experiments.profile_search --passages 8841823 --centroids 262144 [--zipf 0.8]

The plugin's search path (``scoring._search_pipeline``, the CUDA graph a query replays) on
either a colbert-ai index on disk (``--index``, loaded through colbert-ai's IndexScorer as a
Searcher would) or a random residual index generated on the GPU at the given size: the lengths of
``tilemaxsim_plaid.synthetic`` (MS MARCO-like, log-normal), each passage drawing about one distinct centroid
per 3.4 tokens (MS MARCO at C = 2^18 has 185M IVF pairs for 623M embeddings), centroids drawn
with Zipf(``--zipf``) popularity, so inverted lists are as uneven as a clustered corpus's.
Queries are 32 tokens of a random passage's decompressed embeddings plus noise, so their best
cells are the popular ones real queries hit.

For each k (colbert-ai's k-dependent defaults) it prints:

* the graph replay's GPU time (CUDA events) and the host's wall time of the same search called
  as the plugin's ``rank`` is (graph replay, then the ranked list to the host); the graph's GPU
  time again with stage 4's table under the budget alone (``bench_stage4_table.budget_rule``:
  split by query rows, as before one query's table was read whole);
* every kernel of one replay in launch order with its GPU time (torch.profiler / CUPTI), and the
  time by kernel summed over replays, so the part that grows with the corpus (the bitmap over
  every passage, the fixed-capacity candidate lists) is seen apart from the fixed part;
* the centroid-score table built by cuBLAS in fp32 and by the one-launch fp16 build with the
  query's halves (exact products from the fp16 centroids, half the bytes), each also with stage
  1's reductions (after cuBLAS: probe_centroids; in the fp16 build's own launch);
* the candidate list's fixed capacity against the candidates a query actually has, and stage 2
  alone launched with one program per slot of that capacity against the fixed grid that visits
  only the used slots (``num_used``, the default).
* stage 1's argmax over the centroids and max over the query columns of the table, as two torch
  passes against the one fused read (``ops.centroid.probe_centroids``, the default).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import time
import types

import torch
import torch.nn.functional as F

from .bench_stage4_table import budget_rule
from .harness import graph_replay_ms, provenance
from tilemaxsim_plaid.codecs.residual import bucket_table, residual_inverse_norms
from tilemaxsim_plaid.plaid import backends, graphs, scoring
from tilemaxsim_plaid.plaid.device_index import DeviceIndex, device_index
from tilemaxsim_plaid.synthetic import SyntheticIndexSpec, sample_doclens

DIM, NBITS, QUERY_LEN = 128, 2, 32
# MS MARCO at C = 2**18: 623,217,665 embeddings, 185,192,666 (centroid, passage) IVF pairs.
TOKENS_PER_DISTINCT_CODE = 623_217_665 / 185_192_666
KS = (10, 100, 1000)


def _zipf_draws(count: int, num_centroids: int, exponent: float, generator, device) -> torch.Tensor:
    """``count`` centroid ids with Zipf(exponent) popularity over a random order of the ids."""
    weights = torch.arange(1, num_centroids + 1, device=device, dtype=torch.float64).pow(-exponent)
    cdf = (weights.cumsum(0) / weights.sum()).float()
    order = torch.randperm(num_centroids, device=device, generator=generator)
    out = torch.empty(count, dtype=torch.int32, device=device)
    step = 1 << 26
    for start in range(0, count, step):
        u = torch.rand(min(step, count - start), device=device, generator=generator)
        rank = torch.searchsorted(cdf, u).clamp_(max=num_centroids - 1)
        out[start:start + u.numel()] = order[rank].int()
    return out


def synthetic_device_index(passages: int, num_centroids: int, zipf: float, device,
                           seed: int = 0) -> DeviceIndex:
    """A DeviceIndex of ``passages`` random residual-coded passages, generated on ``device``."""
    g = torch.Generator(device=device).manual_seed(seed)
    doclens = torch.from_numpy(sample_doclens(SyntheticIndexSpec(num_passages=passages, seed=seed)))
    doclens = doclens.to(device)
    offsets = torch.zeros(passages + 1, dtype=torch.int64, device=device)
    torch.cumsum(doclens, 0, out=offsets[1:])
    num_tokens = int(offsets[-1])
    distinct = (doclens.double() / TOKENS_PER_DISTINCT_CODE).ceil().long()
    slot_offsets = torch.zeros(passages + 1, dtype=torch.int64, device=device)
    torch.cumsum(distinct, 0, out=slot_offsets[1:])
    slot_codes = _zipf_draws(int(slot_offsets[-1]), num_centroids, zipf, g, device)
    codes = torch.empty(num_tokens, dtype=torch.int32, device=device)
    ivf_keys = []
    step = 1 << 20  # passages per chunk
    for first in range(0, passages, step):
        last = min(first + step, passages)
        lengths = doclens[first:last]
        owner = torch.repeat_interleave(torch.arange(first, last, device=device), lengths)
        pick = (torch.rand(owner.numel(), device=device, generator=g) * distinct[owner]).long()
        chunk_codes = slot_codes[slot_offsets[owner] + pick]
        codes[offsets[first]:offsets[last]] = chunk_codes
        ivf_keys.append(torch.unique(chunk_codes.long() * passages + owner))
    keys = torch.sort(torch.cat(ivf_keys)).values
    del ivf_keys
    ivf_pids = (keys % passages).int()
    ivf_lengths = torch.bincount(keys // passages, minlength=num_centroids)
    del keys
    ivf_offsets = torch.zeros(num_centroids + 1, dtype=torch.int64, device=device)
    torch.cumsum(ivf_lengths, 0, out=ivf_offsets[1:])
    centroids = F.normalize(torch.randn(num_centroids, DIM, device=device, generator=g), dim=-1)
    centroids = centroids.half().float()
    weights = torch.sort(torch.randn(1 << NBITS, device=device, generator=g) * 0.03).values.half().float()
    residuals = torch.randint(0, 256, (num_tokens, DIM * NBITS // 8), device=device, generator=g,
                              dtype=torch.uint8)
    inv_norms = torch.empty(num_tokens, dtype=torch.float32, device=device)
    for start in range(0, num_tokens, 1 << 24):
        stop = min(start + (1 << 24), num_tokens)
        inv_norms[start:stop] = residual_inverse_norms(codes[start:stop], residuals[start:stop],
                                                       centroids, weights, NBITS)
    host_lengths = ivf_lengths.cpu()
    return DeviceIndex(
        device=device, codes=codes, residuals=residuals, offsets=offsets, doclens=doclens,
        centroids=centroids, bucket_weights=weights, bucket_table=bucket_table(NBITS, device),
        ivf_pids=ivf_pids, ivf_offsets=ivf_offsets, ivf_lengths=ivf_lengths, dim=DIM, nbits=NBITS,
        num_docs=passages, num_tokens=num_tokens, max_doclen=int(doclens.max()),
        max_ivf_length=int(host_lengths.max()),
        ivf_lengths_desc_cumsum=torch.sort(host_lengths, descending=True).values.cumsum(0),
        source_key=("synthetic", passages, num_centroids, zipf, seed), inv_norms=inv_norms,
        bucket_weights_in_fp16=True, centroids_half=centroids.half())


def query_batch(index: DeviceIndex, count: int, seed: int = 1, noise: float = 0.3) -> torch.Tensor:
    """[count, QUERY_LEN, dim] fp32: each a random passage's first tokens (repeated if it is
    shorter), decompressed, plus Gaussian noise, normalised."""
    g = torch.Generator(device=index.device).manual_seed(seed)
    pids = torch.randint(0, index.num_docs, (count,), device=index.device, generator=g)
    positions = torch.arange(QUERY_LEN, device=index.device)
    rows = index.offsets[pids][:, None] + positions[None, :] % index.doclens[pids][:, None]
    Q = backends.decompress_tokens(index, rows)
    Q = Q + noise * torch.randn(Q.shape, device=index.device, generator=g) / math.sqrt(index.dim)
    return F.normalize(Q, dim=-1)


def _kernel_events(prof) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of every GPU kernel the profiler saw, in start order."""
    events = []
    for event in prof.profiler.kineto_results.events():
        if event.device_type() == torch.autograd.DeviceType.CUDA and event.duration_ns() > 0:
            events.append((event.name(), event.start_ns() / 1e3, event.duration_ns() / 1e3))
    return sorted(events, key=lambda e: e[1])


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _stage_2_ab(index: DeviceIndex, config, Q: torch.Tensor) -> dict:
    """Stage 2 alone on one query's fixed-capacity list, replayed as a graph (µs): one program
    per slot of the capacity, against the fixed grid that visits the used slots only."""
    table = backends.centroid_table(index, Q)
    pids, valid, num_used, keep = scoring._generate_candidates(index, config, table)
    out = {}
    for label, count in (("per_slot", None), ("used_only", num_used)):
        out[label] = 1e3 * graph_replay_ms(lambda count=count: backends.centroid_interaction(
            index, table, pids, keep=keep, valid=valid, unmatched=scoring.UNMATCHED_TOKEN_SCORE,
            num_used=count))
    return out


def table_builds_us(index: DeviceIndex, Q: torch.Tensor, threshold: float = 0.5) -> dict:
    """Stage 1's centroid-score table for one query, replayed as a graph (µs): cuBLAS fp32 on the
    fp32 centroids (the plugin's default), and the one-launch build from the fp16 centroids with
    the query's fp16 halves (exact products, half the bytes), where the centroids are fp16 values;
    then each with stage 1's reductions: cuBLAS followed by probe_centroids (the default), and
    the split build reducing its own blocks in the same launch (split_query_centroid_probe)."""
    from tilemaxsim_plaid.ops.centroid import probe_centroids
    from tilemaxsim_plaid.ops.residual import split_query_centroid_probe, split_query_centroid_scores

    out = {"cublas_fp32": 1e3 * graph_replay_ms(lambda: backends.centroid_table(index, Q)),
           "cublas_fp32_probe": 1e3 * graph_replay_ms(
               lambda: probe_centroids(backends.centroid_table(index, Q), threshold))}
    if index.centroids_half is not None:
        out["split_fp16"] = 1e3 * graph_replay_ms(
            lambda: split_query_centroid_scores(Q[None], index.centroids_half))
        out["split_fp16_probe"] = 1e3 * graph_replay_ms(
            lambda: split_query_centroid_probe(Q, index.centroids_half, threshold))
    return out


def probe_us(index: DeviceIndex, config, Q: torch.Tensor) -> dict:
    """Stage 1's two reductions of the [C, Lq] table, replayed as a graph (µs): torch's argmax over
    the centroids and max over the query columns (two passes), against the one-pass fused
    ``ops.centroid.probe_centroids`` (the Triton backend's default)."""
    from tilemaxsim_plaid.ops.centroid import probe_centroids

    table = backends.centroid_table(index, Q)
    threshold = config.centroid_score_threshold
    return {"torch_two_passes": 1e3 * graph_replay_ms(
                lambda: (table.argmax(dim=0), table.max(-1).values >= threshold)),
            "fused": 1e3 * graph_replay_ms(lambda: probe_centroids(table, threshold))}


def profile_k(index: DeviceIndex, Qs: torch.Tensor, k: int, replays: int) -> dict:
    config = types.SimpleNamespace(query_maxlen=QUERY_LEN, **scoring.dense_search_knobs(k))
    holder = types.SimpleNamespace()  # carries the captured graphs, as an IndexScorer would
    capacity = index.candidate_capacity(QUERY_LEN * config.ncells)
    counts = []
    with torch.inference_mode():
        for Q in Qs[:16]:
            table = backends.centroid_table(index, Q)
            valid = scoring._generate_candidates(index, config, table)[1]
            counts.append(int(valid.sum()))
        host_ms = []
        for Q in Qs:
            torch.cuda.synchronize()
            start = time.perf_counter()
            graphs.replay(holder, index, config, Q, scoring._search_pipeline, copy=False).to_lists()
            host_ms.append((time.perf_counter() - start) * 1e3)
        host_ms = host_ms[len(host_ms) // 4:]  # the first replays capture and warm up
        Q = Qs[0]
        gpu_ms = graph_replay_ms(lambda: scoring._search_pipeline(index, config, Q))
        with budget_rule():  # stage 4's table split by query rows, as before WHOLE_TABLE_ROWS
            budget_rule_ms = graph_replay_ms(lambda: scoring._search_pipeline(index, config, Q))
        captured = next(iter(holder.__dict__[graphs._CACHE_ATTRIBUTE].values()))
        captured.Q.copy_(Q)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                captured.graph.replay()
            torch.cuda.synchronize()
        stage_2 = _stage_2_ab(index, config, Q)
        probe = probe_us(index, config, Q)
    events = _kernel_events(prof)
    per_replay = len(events) // replays
    one = events[:per_replay]
    timeline = []
    for i, (name, start, duration) in enumerate(one):
        gap = start - (one[i - 1][1] + one[i - 1][2]) if i else 0.0
        timeline.append({"kernel": name, "us": duration, "gap_us": gap})
    by_kernel: dict[str, float] = {}
    for name, _, duration in events:
        by_kernel[name] = by_kernel.get(name, 0.0) + duration / replays
    span = (one[-1][1] + one[-1][2] - one[0][1]) if one else 0.0
    return {"k": k, "knobs": scoring.dense_search_knobs(k), "capacity": capacity, "stage_2_us": stage_2,
            "probe_us": probe,
            "candidates_mean": statistics.mean(counts), "candidates_max": max(counts),
            "graph_gpu_ms": gpu_ms, "graph_gpu_ms_budget_rule": budget_rule_ms,
            "host_p50_ms": statistics.median(host_ms),
            "kernels_per_replay": per_replay, "kernel_us_sum": sum(e["us"] for e in timeline),
            "replay_span_us": span, "timeline": timeline,
            "by_kernel": dict(sorted(by_kernel.items(), key=lambda kv: -kv[1]))}


def print_profile(row: dict, label: str) -> None:
    print(f"\n## {label}, k={row['k']} {row['knobs']}")
    print(f"candidates: capacity {row['capacity']:,}, per query mean {row['candidates_mean']:,.0f}, "
          f"max {row['candidates_max']:,}")
    print(f"graph replay {row['graph_gpu_ms'] * 1e3:.1f} us GPU (span of its kernels "
          f"{row['replay_span_us']:.1f} us, kernels {row['kernel_us_sum']:.1f} us in "
          f"{row['kernels_per_replay']} launches); rank + to_lists p50 {row['host_p50_ms'] * 1e3:.1f} us")
    print(f"graph replay with stage 4's table under the budget alone (split by query rows): "
          f"{row['graph_gpu_ms_budget_rule'] * 1e3:.1f} us GPU")
    print(f"stage 2 alone: one program per slot {row['stage_2_us']['per_slot']:.1f} us, used slots "
          f"only {row['stage_2_us']['used_only']:.1f} us")
    print(f"stage 1 cells and pruning mask: torch argmax + max {row['probe_us']['torch_two_passes']:.1f} us, "
          f"fused {row['probe_us']['fused']:.1f} us")
    print(f"{'#':>3} {'us':>8} {'gap':>6}  kernel")
    for i, e in enumerate(row["timeline"]):
        print(f"{i:>3} {e['us']:>8.1f} {e['gap_us']:>6.1f}  {_short(e['kernel'])}")


def _load_index(path: str, device) -> DeviceIndex:
    from .bench_engines import colbert_searcher
    from .bench_plaid import PATCHED, _patch_as, _prepare_colbert_imports

    _prepare_colbert_imports()
    _patch_as(PATCHED)
    searcher = colbert_searcher(path)
    return device_index(searcher.ranker, device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--index", help="a colbert-ai index directory")
    source.add_argument("--passages", type=int, help="a random index of this many passages")
    parser.add_argument("--centroids", type=int, default=1 << 18)
    parser.add_argument("--zipf", type=float, default=0.8)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--k", type=int, nargs="+", default=list(KS))
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("profile_search needs a CUDA GPU")
    device = torch.device("cuda")
    start = time.perf_counter()
    if args.index:
        index, label = _load_index(args.index, device), args.index
    else:
        index = synthetic_device_index(args.passages, args.centroids, args.zipf, device)
        label = f"random index, {args.passages:,} passages, C={args.centroids}, zipf {args.zipf}"
    print(f"{label}: {index.num_tokens:,} tokens, {index.ivf_pids.numel():,} IVF pairs, longest list "
          f"{index.max_ivf_length:,}, ready in {time.perf_counter() - start:.0f} s")
    Qs = query_batch(index, args.queries)
    rows = [profile_k(index, Qs, k, args.replays) for k in args.k]
    with torch.inference_mode():
        tables = table_builds_us(index, Qs[0])
    for row in rows:
        print_profile(row, label)
    print("\ncentroid-score table, one query: " + ", ".join(f"{name} {us:.1f} us"
                                                         for name, us in tables.items()))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_search.json").write_text(json.dumps(
            {"provenance": provenance(), "source": label, "argv": argv, "rows": rows,
             "table_builds_us": tables}, indent=1))
    print("\n| k | capacity | candidates | graph GPU us | host us | launches | stage 2 per slot / used only us |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['k']} | {row['capacity']:,} | {row['candidates_mean']:,.0f} | "
              f"{row['graph_gpu_ms'] * 1e3:.1f} | {row['host_p50_ms'] * 1e3:.1f} | "
              f"{row['kernels_per_replay']} | {row['stage_2_us']['per_slot']:.1f} / "
              f"{row['stage_2_us']['used_only']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
