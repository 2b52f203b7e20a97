"""bench-engines on the CPU: the fairness construction against files fast-plaid itself wrote
(tests/experiments/fixtures/fast_plaid, recorded on the GPU machine by
experiments/fast_plaid_fixture.py, because fast-plaid is built for another torch), the colbert-ai
side of the shared index against colbert-ai's own loader and IVF builder, the corpus and the
embeddings-directory reader, colbert-ai's own indexer over precomputed embeddings, and the
report (matched comparisons, targets, build times) from a recorded result file."""

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


def test_torch_kmeans_assigns_in_blocks_as_in_one_pass(monkeypatch):
    """The torch k-means (where fast-plaid's does not import) bounds the similarities it holds
    at once: blocks of rows give the centroids one pass gives."""
    from experiments import engine_index

    g = torch.Generator().manual_seed(1)
    tokens = torch.nn.functional.normalize(torch.randn(300, 16, generator=g), dim=-1)
    whole = engine_index._spherical_kmeans(tokens, 12, 3, 0, "cpu")
    monkeypatch.setattr(engine_index, "KMEANS_BLOCK_BYTES", 7 * 4 * 12)  # 7 rows a block
    assert torch.equal(engine_index._spherical_kmeans(tokens, 12, 3, 0, "cpu"), whole)
    assert whole.shape == (12, 16) and whole.dtype == torch.float16


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
            ("load", "tilemaxsim"), ("build", "shared"), ("exactness", "tilemaxsim"),
            ("build", "colbert-ai CollectionIndexer")} <= suites
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


# --------------------------------------------------------------------------- embeddings directories

def _write_embeddings_dir(path: pathlib.Path, passages: int = 60, queries: int = 5, dim: int = 32,
                          name: str = "tiny-test") -> pathlib.Path:
    """A synthetic corpus written in the embeddings-directory format, the last query without a target."""
    from experiments.engine_corpus import Corpus, CorpusSpec

    corpus = Corpus(CorpusSpec(num_passages=passages, num_queries=queries, dim=dim, doclen_median=12,
                               doc_maxlen=40, query_tokens=8, chunk_passages=25))
    Q, targets = corpus.queries()
    targets = targets.astype(np.int64).copy()
    targets[-1] = -1
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps(
        {"name": name, "encoder": "synthetic", "dim": dim, "doc_maxlen": 40, "query_maxlen": 8,
         "num_passages": passages, "num_queries": queries, "note": "test corpus"}))
    np.save(path / "doclens.npy", corpus.doclens.astype(np.int64))
    np.save(path / "documents.npy", torch.cat([corpus.chunk(i) for i, *_ in corpus.chunk_ranges()]).numpy())
    np.save(path / "queries.npy", Q.numpy())
    np.save(path / "targets.npy", targets)
    (path / "doc_ids.json").write_text(json.dumps([f"d{i}" for i in range(passages)]))
    (path / "query_ids.json").write_text(json.dumps([f"q{i}" for i in range(queries)]))
    return path


def test_embedding_corpus_reads_the_directory_format(tmp_path):
    from experiments.engine_corpus import EmbeddingCorpus

    path = _write_embeddings_dir(tmp_path / "emb")
    corpus = EmbeddingCorpus(path, chunk_passages=16)
    documents = np.load(path / "documents.npy")
    assert corpus.name == "tiny-test" and corpus.num_passages == 60 and corpus.dim == 32
    assert corpus.num_embeddings == documents.shape[0] and corpus.query_maxlen == 8
    assert [r[1:] for r in corpus.chunk_ranges()] == [(0, 16), (16, 32), (32, 48), (48, 60)]
    assert torch.equal(torch.cat([corpus.chunk(i) for i, *_ in corpus.chunk_ranges()]),
                       torch.from_numpy(documents))
    first, end = 16, 32
    rows = corpus.offsets[first:end + 1]
    assert torch.equal(corpus.chunk_offsets(1), torch.from_numpy(rows - rows[0]))
    Q, targets = corpus.queries()
    assert Q.dtype == torch.float16 and Q.shape == (5, 8, 32)
    assert torch.equal(Q, torch.from_numpy(np.load(path / "queries.npy")))
    assert targets.tolist() == np.load(path / "targets.npy").tolist() and targets[-1] == -1
    assert corpus.key()["embeddings"]["name"] == "tiny-test"


def _break(path: pathlib.Path, case: str) -> None:
    meta = json.loads((path / "meta.json").read_text())
    doclens, documents = np.load(path / "doclens.npy"), np.load(path / "documents.npy")
    queries, targets = np.load(path / "queries.npy"), np.load(path / "targets.npy")
    if case.startswith("missing "):
        (path / case.removeprefix("missing ")).unlink()
    elif case == "meta not json":
        (path / "meta.json").write_text("{")
    elif case == "meta key missing":
        del meta["encoder"]
    elif case == "meta dim not int":
        meta["dim"] = "32"
    elif case == "doclens int32":
        np.save(path / "doclens.npy", doclens.astype(np.int32))
    elif case == "doclens length":
        meta["num_passages"] += 1
    elif case == "empty passage":
        doclens[3], doclens[4] = 0, doclens[4] + doclens[3]
        np.save(path / "doclens.npy", doclens)
    elif case == "documents float32":
        np.save(path / "documents.npy", documents.astype(np.float32))
    elif case == "doclens do not sum to the rows":
        np.save(path / "documents.npy", documents[:-1])
    elif case == "documents dim":
        np.save(path / "documents.npy", documents[:, :16])
    elif case == "queries dim":
        np.save(path / "queries.npy", queries[:, :, :16])
    elif case == "queries query_maxlen":
        np.save(path / "queries.npy", queries[:, :4])
    elif case == "queries float32":
        np.save(path / "queries.npy", queries.astype(np.float32))
    elif case == "targets count":
        np.save(path / "targets.npy", targets[:-1])
    elif case == "target out of range":
        targets[0] = meta["num_passages"]
        np.save(path / "targets.npy", targets)
    elif case == "target below -1":
        targets[0] = -2
        np.save(path / "targets.npy", targets)
    elif case == "targets pickled":
        np.save(path / "targets.npy", np.array([object()] * len(targets)), allow_pickle=True)
    if case not in ("missing meta.json", "meta not json"):
        (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("case, message", [
    ("missing meta.json", "no meta.json"),
    ("missing doclens.npy", "no doclens.npy"),
    ("missing documents.npy", "no documents.npy"),
    ("missing queries.npy", "no queries.npy"),
    ("missing targets.npy", "no targets.npy"),
    ("meta not json", "meta.json is not JSON"),
    ("meta key missing", "'encoder' must be a str"),
    ("meta dim not int", "'dim' must be a int"),
    ("doclens int32", "doclens.npy must be int64"),
    ("doclens length", r"doclens.npy must have shape \(61,\)"),
    ("empty passage", "passage 3 has 0 tokens"),
    ("documents float32", "documents.npy must be float16"),
    ("doclens do not sum to the rows", "documents.npy must have shape .*sum\\(doclens.npy\\)"),
    ("documents dim", "documents.npy must have shape"),
    ("queries dim", "queries.npy must have shape"),
    ("queries query_maxlen", "queries.npy must have shape"),
    ("queries float32", "queries.npy must be float16"),
    ("targets count", "targets.npy must have shape"),
    ("target out of range", "query 0 targets pid 60, outside 0..59"),
    ("target below -1", "query 0 targets pid -2"),
    ("targets pickled", "targets.npy is not a plain .npy array"),
])
def test_embedding_corpus_refuses_a_malformed_directory(tmp_path, case, message):
    from experiments.engine_corpus import EmbeddingCorpus

    path = _write_embeddings_dir(tmp_path / "emb")
    _break(path, case)
    with pytest.raises(ValueError, match=message):
        EmbeddingCorpus(path)


def test_embedding_corpus_refuses_a_missing_directory(tmp_path):
    from experiments.engine_corpus import EmbeddingCorpus

    with pytest.raises(ValueError, match="does not exist"):
        EmbeddingCorpus(tmp_path / "nowhere")


def test_bench_engines_refuses_to_start_without_colbert_ai(tmp_path, capsys, monkeypatch):
    """Without colbert-ai the run stops before building anything, saying what to install."""
    import sys

    from experiments import bench_engines

    monkeypatch.setitem(sys.modules, "colbert.infra.config", None)  # import raises ImportError
    with pytest.raises(SystemExit):
        bench_engines.main(["--passages", "50", "--work", str(tmp_path / "work"),
                            "--out", str(tmp_path / "out")])
    assert "colbert-ai cannot be imported" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_bench_engines_refuses_a_bad_embeddings_argument(tmp_path, capsys):
    from experiments import bench_engines

    path = _write_embeddings_dir(tmp_path / "emb")
    (path / "targets.npy").unlink()
    with pytest.raises(SystemExit):
        bench_engines.main(["--embeddings", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "--embeddings: " in err and "no targets.npy" in err
    with pytest.raises(SystemExit):
        bench_engines.main(["--embeddings", str(path), "--passages", "100", "--out", str(tmp_path / "out")])
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_success_skips_queries_without_a_target():
    from experiments.bench_engines import success_at

    assert success_at([[1, 2], [3, 4], [5, 6]], [2, -1, 9], 2) == 0.5


@pytest.mark.colbert
def test_bench_engines_on_an_embeddings_directory(tmp_path):
    """The whole bench on a directory of precomputed embeddings: rows labelled by the meta name,
    colbert-ai's own indexer timed on a subset, and a report section of their own."""
    from experiments import bench_engines, report_engines

    path = _write_embeddings_dir(tmp_path / "emb", passages=120, queries=4)
    out = tmp_path / "out"
    assert bench_engines.main(["--embeddings", str(path), "--ks", "10", "--settings", "defaults",
                               "--latency-queries", "4", "--stock-queries", "2", "--exact-queries", "4",
                               "--batch", "3", "--throughput-queries", "8", "--warmup", "1",
                               "--colbert-build-max", "100",
                               "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    rows = json.loads((out / "engines.json").read_text())["rows"]
    assert {r["shape"].split(" k=")[0] for r in rows} == {"tiny-test 120 passages"}
    shared = next(r for r in rows if r["suite"] == "build" and r["provider"] == "shared")
    assert shared["corpus_meta"]["encoder"] == "synthetic" and shared["num_passages"] == 120
    built = next(r for r in rows if r["provider"] == bench_engines.COLBERT_INDEXER)
    assert built["passages"] == 100 and built["seconds"] > 0 and "CPU" in built["kmeans_on"]
    # The directory holds 4 queries: the 8-query throughput set is the 4 there are.
    assert {r["queries"] for r in rows if r["suite"] == "throughput"} <= {2, 3, 4}
    latency = [r for r in rows if r["suite"] == "latency"]
    assert {r["provider"] for r in latency} == {"colbert-ai", "tilemaxsim"}
    assert all(0.0 <= r["recall@10"] <= 1.0 for r in latency)
    exactness = next(r for r in rows if r["suite"] == "exactness")
    assert exactness["rerank_not_exact_top10"] == 0 and exactness["unsorted_lists"] == 0
    assert report_engines.corpus_of(latency[0]) == "tiny-test"
    synthetic, _ = report_engines.load_rows([FIXTURES / "engines"])
    text = report_engines.build_report(synthetic + rows, [{"file": "x"}], tmp_path / "report").read_text()
    assert "# Corpus: tiny-test" in text and "# Corpus: synthetic" in text
    assert "encoder synthetic" in text and "(tiny-test)" in text


@pytest.mark.colbert
def test_colbert_indexer_build_writes_a_loadable_index(tmp_path):
    """colbert-ai's own CollectionIndexer over precomputed embeddings: every phase timed, and the
    index it writes loads in colbert-ai's Searcher and finds a passage from its own tokens."""
    from colbert.search.index_loader import IndexLoader

    from experiments.bench_engines import COLBERT_INDEXER, colbert_indexer_build, colbert_searcher
    from experiments.engine_corpus import Corpus, CorpusSpec

    corpus = Corpus(CorpusSpec(num_passages=300, num_queries=2, dim=64, doclen_median=20, chunk_passages=128))
    row = colbert_indexer_build(corpus, tmp_path, 2, 250, "300 passages")
    assert row["provider"] == COLBERT_INDEXER and row["passages"] == 250
    assert row["num_embeddings"] == int(corpus.offsets[250])
    assert set(row["phase_seconds"]) == {"setup", "kmeans", "codec", "train_other", "compress", "ivf"}
    assert all(value >= 0 for value in row["phase_seconds"].values())
    assert row["seconds"] == pytest.approx(sum(row["phase_seconds"].values()))
    loader = IndexLoader(row["index_path"], use_gpu=False)
    assert loader.doclens.tolist() == corpus.doclens[:250].tolist()
    assert loader.embeddings.codes.shape[0] >= row["num_embeddings"]
    searcher = colbert_searcher(row["index_path"])
    searcher.configure(ncells=4, centroid_score_threshold=0.0, ndocs=256)
    E = torch.cat([corpus.chunk(0), corpus.chunk(1)])
    for pid in (0, 137, 249):
        q = E[int(corpus.offsets[pid]):int(corpus.offsets[pid + 1])][:32].float()
        pids, _, _ = searcher.dense_search(q[None], 3)
        assert pids[0] == pid


def test_report_matched_comparisons_and_targets_from_a_recorded_result(tmp_path):
    """At k = 10, 100 and 1000 on the recorded 8.8M rows: each pair's other engine is its fastest
    setting within the slack, the anchor its engine's fastest, and every target computed from
    the rows it names."""
    from experiments import report_engines as rep

    rows, provenances = rep.load_rows([FIXTURES / "engines"])
    size = max(rep._passages(r) for r in rows if r["suite"] == "latency")
    for k in (10, 100, 1000):
        matched = rep.matched_at_k(rows, size, k)
        metric = matched["metric"]
        assert metric == ("recall@10" if k == 10 else "recall@100")
        at_k = [r for r in rows if r["suite"] == "latency" and r["k"] == k and metric in r]
        fastest = {e: min((r for r in at_k if r["provider"] == e), key=lambda r: r["p50_ms"])
                   for e in (rep.PLUGIN, rep.FAST_PLAID)}
        first, second = matched["pairs"]
        assert first["plugin"] is fastest[rep.PLUGIN] and second["fast_plaid"] is fastest[rep.FAST_PLAID]
        for pair, other, anchor in ((first, "fast_plaid", "plugin"), (second, "plugin", "fast_plaid")):
            engine = rep.FAST_PLAID if other == "fast_plaid" else rep.PLUGIN
            good = [r for r in at_k if r["provider"] == engine
                    and r[metric] >= pair[anchor][metric] - rep.MATCHED_RECALL_SLACK]
            assert pair[other] is min(good, key=lambda r: r["p50_ms"])
            assert pair["speedup"] == pytest.approx(pair["fast_plaid"]["p50_ms"] / pair["plugin"]["p50_ms"])
    checks = rep.targets(rows)
    assert len(checks) == 12 and all(c["measured"] is not None for c in checks)
    for c in checks:
        expected = c["measured"] <= c["threshold"] if c["op"] == "<=" else c["measured"] >= c["threshold"]
        assert c["passed"] == expected
    by = {(c["k"], c["target"].split(" (")[0].split(" at ")[0]): c for c in checks}
    plugin, stock = (rep._latency(rows, size, e, 10) for e in (rep.PLUGIN, rep.STOCK))
    assert by[(10, "plugin p50")]["measured"] == plugin["p50_ms"]
    assert by[(10, "stock colbert-ai p50 / plugin p50")]["measured"] == pytest.approx(
        stock["p50_ms"] / plugin["p50_ms"])
    assert by[(10, "fast-plaid p50 / plugin p50")]["measured"] == pytest.approx(
        min(p["speedup"] for p in rep.matched_at_k(rows, size, 10)["pairs"]))
    text = rep.build_report(rows, provenances, tmp_path).read_text()
    for heading in ("## At matched recall per k", "## Targets (8,841,823 passages", "## Index build time"):
        assert heading in text
    assert "# Corpus:" not in text  # one corpus: no per-corpus headings


def test_report_build_time_table_compares_per_million_embeddings():
    from experiments import report_engines as rep

    rows = [{"suite": "build", "shape": "1,000 passages", "provider": "shared", "num_passages": 1000,
             "num_embeddings": 2_000_000, "num_centroids": 4096, "centroids_from": "torch k-means",
             "phase_seconds": {"kmeans_and_codec": 1.0, "compress_and_write": 2.0, "total": 4.0}, "seconds": 4.0},
            {"suite": "build", "shape": "1,000 passages", "provider": "colbert-ai CollectionIndexer",
             "passages": 500, "num_embeddings": 1_000_000, "seconds": 3.0, "kmeans_on": "CPU, faiss 1.15.1",
             "phase_seconds": {"setup": 0.5, "kmeans": 2.0, "codec": 0.1, "train_other": 0.1,
                               "compress": 0.2, "ivf": 0.1}}]
    shared, colbert = rep._build_rows(rows, rep.SYNTHETIC)
    assert shared[2:6] == [1000, 2_000_000, 4.0, 2.0]
    assert "ivf_and_metadata 1.0" in shared[6]
    assert colbert[1:6] == ["colbert-ai CollectionIndexer", 500, 1_000_000, 3.0, 3.0]
    assert colbert[7] == "CPU, faiss 1.15.1"
