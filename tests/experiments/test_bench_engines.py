"""bench-engines on the CPU: the fairness construction against files fast-plaid itself wrote
(tests/experiments/fixtures/fast_plaid, recorded on the GPU machine by
experiments/fast_plaid_fixture.py, because fast-plaid is built for another torch), the colbert-ai
side of the shared index against colbert-ai's own loader and IVF builder, the corpus, and the
report from a recorded result file."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
FAST_PLAID = FIXTURES / "fast_plaid"
CODEC_FILES = ("centroids", "bucket_cutoffs", "bucket_weights", "avg_residual", "cluster_threshold")


def _fixture(nbits: int):
    root = FAST_PLAID / f"nbits{nbits}"
    recorded = torch.load(root / "fixture.pt", weights_only=False)
    codec = {name: torch.from_numpy(np.load(root / "index" / f"{name}.npy")) for name in CODEC_FILES}
    return root / "index", recorded, codec


@pytest.mark.parametrize("nbits", [2, 4])
def test_compressor_reproduces_fast_plaid_create_and_its_decompression(nbits):
    from tilemaxsim_plaid.codecs.residual import compress_residuals, decompress_residuals

    index, recorded, codec = _fixture(nbits)
    E = torch.cat(recorded["docs"])
    codes, residuals = compress_residuals(E, codec["centroids"], codec["bucket_cutoffs"], nbits)
    theirs_codes = torch.from_numpy(np.load(index / "merged_codes.npy"))
    theirs_residuals = torch.from_numpy(np.load(index / "merged_residuals.npy"))
    assert torch.equal(codes, theirs_codes[: E.shape[0]])
    assert torch.equal(residuals, theirs_residuals[: E.shape[0]])
    # colbert-ai's GPU codec (fp16 centroids and weights) is what fast-plaid's get_embeddings returns.
    decoded = decompress_residuals(codes, residuals, codec["centroids"], codec["bucket_weights"].half(), nbits)
    assert torch.equal(decoded.float(), torch.cat(recorded["decompressed"]))


@pytest.mark.parametrize("nbits", [2, 4])
def test_shared_index_writes_fast_plaid_files_byte_for_byte(tmp_path, nbits):
    from experiments.engine_corpus import EmbeddingList
    from experiments.engine_index import write_shared_index

    index, recorded, codec = _fixture(nbits)
    write_shared_index(EmbeddingList(recorded["docs"], device="cpu"), tmp_path, nbits=nbits,
                       codec=codec, log=lambda line: None)
    ours = tmp_path / "fast_plaid"
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in index.iterdir())
    for theirs in index.iterdir():
        assert (ours / theirs.name).read_bytes() == theirs.read_bytes(), theirs.name


@pytest.mark.colbert
def test_shared_index_colbert_side_loads_and_matches_colbert_ai(tmp_path):
    """colbert-ai's loader reads the same codes and residual bytes, its codec decompresses them
    as ours does, and its own optimize_ivf builds the same inverted lists from the codes."""
    from colbert.indexing.codecs.residual import ResidualCodec
    from colbert.indexing.codecs.residual_embeddings import ResidualEmbeddings
    from colbert.indexing.utils import optimize_ivf
    from colbert.search.index_loader import IndexLoader

    from experiments.engine_corpus import EmbeddingList
    from experiments.engine_index import write_shared_index
    from tilemaxsim_plaid.codecs.residual import decompress_residuals

    _, recorded, codec = _fixture(2)
    write_shared_index(EmbeddingList(recorded["docs"], device="cpu", chunk_passages=20), tmp_path,
                       nbits=2, codec=codec, log=lambda line: None)
    colbert = tmp_path / "colbert"
    loader = IndexLoader(str(colbert), use_gpu=False)
    merged_codes = torch.from_numpy(np.load(tmp_path / "fast_plaid" / "merged_codes.npy"))
    T = int(sum(len(d) for d in recorded["docs"]))
    assert torch.equal(loader.embeddings.codes[:T].long(), merged_codes[:T])
    assert loader.doclens.tolist() == [len(d) for d in recorded["docs"]]
    colbert_codec = ResidualCodec.load(str(colbert))
    codes, residuals = loader.embeddings.codes[:T], loader.embeddings.residuals[:T]
    theirs = colbert_codec.decompress(ResidualEmbeddings(codes, residuals))
    ours = decompress_residuals(codes, residuals, colbert_codec.centroids, colbert_codec.bucket_weights, 2)
    assert torch.equal(theirs, ours)
    ivf, lengths = torch.load(colbert / "ivf.pid.pt")
    orig_ivf = torch.sort(merged_codes[:T], stable=True).indices
    orig_lengths = torch.bincount(merged_codes[:T], minlength=codec["centroids"].shape[0])
    work = tmp_path / "optimize"
    work.mkdir()
    for path in [*colbert.glob("doclens.*.json"), *colbert.glob("*metadata.json"), colbert / "plan.json"]:
        (work / path.name).write_bytes(path.read_bytes())
    expected_ivf, expected_lengths = optimize_ivf(orig_ivf, orig_lengths, str(work), verbose=0)
    assert torch.equal(lengths, expected_lengths)
    assert torch.equal(ivf, expected_ivf.to(ivf.dtype))


def test_corpus_is_deterministic_and_queries_have_targets():
    from experiments.engine_corpus import Corpus, CorpusSpec

    spec = CorpusSpec(num_passages=120, num_queries=6, chunk_passages=50, dim=64)
    a, b = Corpus(spec), Corpus(spec)
    assert [r for r in a.chunk_ranges()] == [(0, 0, 50), (1, 50, 100), (2, 100, 120)]
    assert torch.equal(a.chunk(2), b.chunk(2))
    E = a.chunk(1)
    assert E.dtype == torch.float16 and E.shape == (int(a.chunk_offsets(1)[-1]), 64)
    assert torch.allclose(E.float().norm(dim=-1), torch.ones(E.shape[0]), atol=2e-3)
    Q, targets = a.queries()
    assert Q.shape == (6, 32, 64) and len(set(targets.tolist())) == 6
    # Each query scores its own target above the median passage of the corpus.
    from tilemaxsim_plaid import reference

    D = torch.cat([a.chunk(i) for i, *_ in a.chunk_ranges()]).float()
    scores = reference.maxsim_packed(Q.float(), D, torch.from_numpy(a.offsets), dtype=torch.float32)
    assert (scores[torch.arange(6), torch.from_numpy(targets)] > scores.median(dim=1).values).all()
    with pytest.raises(ValueError, match="num_passages"):
        CorpusSpec(num_passages=0)
    with pytest.raises(IndexError):
        a.chunk(3)


def test_embedding_list_refuses_bad_documents():
    from experiments.engine_corpus import EmbeddingList

    with pytest.raises(ValueError, match="at least one"):
        EmbeddingList([])
    with pytest.raises(ValueError, match="one d"):
        EmbeddingList([torch.zeros(3, 8), torch.zeros(2, 16)])
    with pytest.raises(ValueError, match="no tokens"):
        EmbeddingList([torch.zeros(3, 8), torch.zeros(0, 8)])


def test_exact_topk_merges_chunks_like_one_pass():
    from experiments.engine_corpus import ExactTopK

    scores = torch.randn(3, 40)
    scores[:, 7] = scores[:, 30] = 5.0  # a tie across chunks keeps the lower pid first
    merged = ExactTopK.empty(3, 5, "cpu")
    for start in range(0, 40, 16):
        merged.update(scores[:, start:start + 16], start)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :5]
    assert torch.equal(merged.pids, order)
    assert (merged.pids[:, :2] == torch.tensor([7, 30])).all()


def test_recall_and_success():
    from experiments.bench_engines import recall_at, success_at

    exact = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert recall_at([[1, 9, 3], [6, 5, 4]], exact, 3) == pytest.approx((2 / 3 + 1) / 2)
    assert success_at([[1, 9], [6, 5]], [9, 7], 2) == 0.5


@pytest.mark.colbert
def test_bench_engines_end_to_end_on_cpu(tmp_path):
    """stock colbert-ai and the plugin on a 200-passage corpus (fast-plaid is skipped with a
    warning where it is not installed): every row the report needs, and exact rankings."""
    from experiments import bench_engines, report_engines

    out = tmp_path / "out"
    assert bench_engines.main(["--passages", "200", "--ks", "10", "--settings", "defaults",
                               "--latency-queries", "3", "--stock-queries", "2", "--exact-queries", "3",
                               "--batch", "2", "--throughput-queries", "3", "--warmup", "1",
                               "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    rows = json.loads((out / "engines.json").read_text())["rows"]
    suites = {(r["suite"], r["provider"]) for r in rows}
    assert {("latency", "colbert-ai"), ("latency", "tilemaxsim"), ("throughput", "tilemaxsim"),
            ("load", "tilemaxsim"), ("build", "shared"), ("exactness", "tilemaxsim")} <= suites
    exactness = next(r for r in rows if r["suite"] == "exactness")
    assert exactness["unsorted_lists"] == 0 and exactness["max_abs_score_diff"] < 1e-4
    assert exactness["queries"] == 3 and exactness["rerank_not_exact_top10"] == 0
    latency = [r for r in rows if r["suite"] == "latency"]
    assert all(0.0 <= r["recall@10"] <= 1.0 and r["p50_ms"] > 0 for r in latency)
    report = report_engines.build_report(rows, [{"file": "x"}], tmp_path / "report")
    assert "tilemaxsim" in report.read_text()


def test_report_from_a_recorded_result(tmp_path):
    from experiments import report_engines

    rows, provenances = report_engines.load_rows([FIXTURES / "engines"])
    path = report_engines.build_report(rows, provenances, tmp_path)
    text = path.read_text()
    assert "Batch-1 latency" in text and "fast-plaid" in text
    for plot in ("latency_vs_corpus.png", "qps_vs_batch.png", "recall_vs_latency.png"):
        assert (tmp_path / plot).stat().st_size > 1000
    matched = report_engines.matched_recall(rows, max(report_engines._passages(r) for r in rows
                                                      if r["suite"] == "latency"))
    for m in matched:
        if m["plugin"] is not None:
            assert m["plugin"]["recall@10"] >= m["fast_plaid"]["recall@10"] - report_engines.MATCHED_RECALL_SLACK
    assert report_engines.main([str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
