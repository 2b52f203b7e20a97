"""Synthetic PLAID indexes: colbert-ai's on-disk format, loadable and searchable by stock
colbert-ai's Searcher and by the plugin."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from tilemaxsim_plaid import synthetic
from tilemaxsim_plaid.synthetic import SyntheticIndexSpec

# Files colbert-ai's CollectionIndexer leaves in an index folder (one chunk per index here).
COLBERT_INDEX_FILES = {"plan.json", "metadata.json", "centroids.pt", "buckets.pt",
                       "avg_residual.pt", "ivf.pid.pt"}
CHUNK_FILES = ("{i}.codes.pt", "{i}.residuals.pt", "doclens.{i}.json", "{i}.metadata.json")
NUM_PASSAGES = 1_200
CHUNK_PASSAGES = 500  # several chunks at test size


@pytest.mark.parametrize("field, value", [
    pytest.param("num_passages", 0, id="no-passages"),
    pytest.param("nbits", 3, id="nbits-3"),
    pytest.param("dim", 100, id="dim-not-multiple-of-8"),
    pytest.param("min_doclen", 500, id="min-above-max"),
    pytest.param("topic_fraction", 1.5, id="fraction"),
    pytest.param("num_centroids", 1000, id="centroids-not-power-of-two"),
])
def test_spec_rejects_bad_fields_by_name(field, value):
    arguments = {"num_passages": 10, field: value}
    with pytest.raises(ValueError, match=field):
        SyntheticIndexSpec(**arguments)


@pytest.mark.parametrize("num_embeddings", [1_000, 26_195, 70e6, 600e6])
def test_num_partitions_follows_colbert(num_embeddings):
    expected = int(2 ** np.floor(np.log2(16 * np.sqrt(num_embeddings))))  # collection_indexer.py
    assert synthetic.num_partitions_for(num_embeddings) == expected


def test_doclens_are_clipped_skewed_and_deterministic():
    spec = SyntheticIndexSpec(num_passages=50_000)
    lengths = synthetic.sample_doclens(spec)
    assert lengths.dtype == np.int64 and lengths.shape == (50_000,)
    assert lengths.min() >= spec.min_doclen and lengths.max() <= spec.doc_maxlen
    assert np.median(lengths) == pytest.approx(spec.doclen_median, rel=0.05)
    assert lengths.mean() > np.median(lengths)  # right-skewed
    assert (lengths == spec.doc_maxlen).any()  # the cap is reached, as truncation does
    assert np.array_equal(lengths, synthetic.sample_doclens(spec))


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    """A 1,200-passage synthetic index written in three chunks."""
    path = tmp_path_factory.mktemp("synthetic") / "syn"
    spec = SyntheticIndexSpec(num_passages=NUM_PASSAGES, num_queries=24, seed=7)
    original = synthetic.COLBERT_CHUNK_PASSAGES
    synthetic.COLBERT_CHUNK_PASSAGES = CHUNK_PASSAGES
    try:
        manifest = synthetic.write_synthetic_index(spec, path, progress=False)
    finally:
        synthetic.COLBERT_CHUNK_PASSAGES = original
    return path, spec, manifest


def test_files_dtypes_and_shapes_are_colbert_ai_s(small_index):
    path, spec, manifest = small_index
    num_chunks = math.ceil(NUM_PASSAGES / CHUNK_PASSAGES)
    expected = set(COLBERT_INDEX_FILES)
    for i in range(num_chunks):
        expected |= {name.format(i=i) for name in CHUNK_FILES}
    written = {p.name for p in path.iterdir()}
    assert expected <= written
    assert written - expected == {synthetic.SYNTHETIC_MANIFEST, synthetic.SYNTHETIC_QUERIES}

    metadata = json.loads((path / "metadata.json").read_text())
    plan = json.loads((path / "plan.json").read_text())
    assert metadata["num_chunks"] == plan["num_chunks"] == num_chunks
    assert metadata["config"]["dim"] == spec.dim and metadata["config"]["nbits"] == spec.nbits
    C = metadata["num_partitions"]
    assert C == synthetic.num_partitions_for(metadata["num_embeddings"])

    centroids = torch.load(path / "centroids.pt")
    assert centroids.dtype == torch.float16 and centroids.shape == (C, spec.dim)
    assert torch.allclose(centroids.float().norm(dim=-1), torch.ones(C), atol=2e-3)
    cutoffs, weights = torch.load(path / "buckets.pt")
    assert cutoffs.dtype == weights.dtype == torch.float32
    assert cutoffs.shape == (2**spec.nbits - 1,) and weights.shape == (2**spec.nbits,)
    assert torch.all(weights[1:] > weights[:-1]) and torch.all(cutoffs[1:] > cutoffs[:-1])
    assert torch.load(path / "avg_residual.pt").dim() == 0

    offset, total = 0, 0
    for i in range(num_chunks):
        chunk = json.loads((path / f"{i}.metadata.json").read_text())
        doclens = json.loads((path / f"doclens.{i}.json").read_text())
        codes = torch.load(path / f"{i}.codes.pt")
        residuals = torch.load(path / f"{i}.residuals.pt")
        assert chunk["passage_offset"] == offset and chunk["num_passages"] == len(doclens)
        assert chunk["embedding_offset"] == total and chunk["num_embeddings"] == sum(doclens)
        assert codes.dtype == torch.int32 and codes.shape == (sum(doclens),)
        assert residuals.dtype == torch.uint8
        assert residuals.shape == (sum(doclens), spec.dim * spec.nbits // 8)
        assert int(codes.min()) >= 0 and int(codes.max()) < C
        offset += len(doclens)
        total += sum(doclens)
    assert offset == NUM_PASSAGES and total == metadata["num_embeddings"]
    assert manifest["num_embeddings"] == total


def test_ivf_lists_are_exactly_the_passages_using_each_centroid(small_index):
    path, spec, manifest = small_index
    codes, pids = [], []
    for i in range(manifest["num_chunks"]):
        doclens = json.loads((path / f"doclens.{i}.json").read_text())
        start = json.loads((path / f"{i}.metadata.json").read_text())["passage_offset"]
        codes.append(torch.load(path / f"{i}.codes.pt").long())
        pids.append(torch.repeat_interleave(torch.arange(start, start + len(doclens)),
                                            torch.tensor(doclens)))
    codes, pids = torch.cat(codes), torch.cat(pids)
    ivf, lengths = torch.load(path / "ivf.pid.pt")
    assert ivf.dtype == torch.int32 and lengths.dtype == torch.int64
    assert lengths.shape == (manifest["num_centroids"],)
    offsets = torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)))
    for centroid in torch.randperm(manifest["num_centroids"])[:200].tolist():
        members = ivf[offsets[centroid]: offsets[centroid + 1]].long()
        expected = torch.unique(pids[codes == centroid])  # sorted, unique: as optimize_ivf
        assert torch.equal(members, expected)
    # Skewed popularity: the longest list is several times the mean, as in real indexes.
    assert lengths.max().item() > 3 * lengths.float().mean().item()


def test_rewriting_the_same_spec_is_a_no_op_and_another_spec_is_refused(small_index):
    path, spec, manifest = small_index
    before = (path / "0.residuals.pt").stat().st_mtime_ns
    assert synthetic.write_synthetic_index(spec, path, progress=False) == manifest
    assert (path / "0.residuals.pt").stat().st_mtime_ns == before
    assert synthetic.synthetic_index_complete(path, spec)
    other = SyntheticIndexSpec(num_passages=NUM_PASSAGES, num_queries=24, seed=8)
    with pytest.raises(ValueError, match="another spec"):
        synthetic.write_synthetic_index(other, path, progress=False)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint

    return build_minilm_checkpoint(tmp_path_factory.mktemp("checkpoint") / "minilm", dim=128)


@pytest.mark.colbert
def test_stock_searcher_and_plugin_load_and_search_it(small_index, checkpoint_dir):
    from colbert import Searcher
    from colbert.infra.config import ColBERTConfig

    from tilemaxsim_plaid import plaid

    path, spec, manifest = small_index
    queries, targets = synthetic.load_synthetic_queries(path)
    assert queries.dtype == torch.float16
    assert queries.shape == (24, spec.query_maxlen, spec.dim)

    def search_all():
        searcher = Searcher(index=path.name, index_root=str(path.parent), checkpoint=checkpoint_dir,
                            config=ColBERTConfig(ncells=4, centroid_score_threshold=0.3, ndocs=512),
                            verbose=0)
        text_pids, _, _ = searcher.search("a sentence about anything", k=5)
        ranked = [searcher.dense_search(queries[i : i + 1].float(), k=10)
                  for i in range(len(targets))]
        return text_pids, ranked

    plaid.disable()
    try:
        with plaid.enabled(groups=("compat",)):
            text_pids, stock = search_all()
        with plaid.enabled():
            _, patched = search_all()
    finally:
        plaid.disable()

    assert len(text_pids) == 5 and all(0 <= pid < NUM_PASSAGES for pid in text_pids)
    hits = sum(int(target) in pids[:10] for target, (pids, _, _) in zip(targets, stock))
    # Each query copies centroids of its target passage: most targets come back on top.
    assert hits >= 0.75 * len(targets)
    for (stock_pids, _, stock_scores), (patched_pids, _, patched_scores) in zip(stock, patched):
        assert patched_pids == stock_pids
        assert patched_scores == pytest.approx(stock_scores, abs=1e-3)


def test_verify_accepts_a_written_index_and_names_what_is_broken(small_index, tmp_path):
    path, spec, manifest = small_index
    totals = synthetic.verify_synthetic_index(path, progress=False)
    assert totals["passages"] == NUM_PASSAGES and totals["embeddings"] == manifest["num_embeddings"]

    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    doclens = json.loads((broken / "doclens.1.json").read_text())
    (broken / "doclens.1.json").write_text(json.dumps(doclens[:-1]))
    with pytest.raises(ValueError, match=r"1\.metadata\.json"):
        synthetic.verify_synthetic_index(broken, progress=False)

    shutil.copytree(path, broken, dirs_exist_ok=True)
    ivf, lengths = torch.load(broken / "ivf.pid.pt")
    first = int(torch.nonzero(lengths > 1)[0])
    start = int(lengths[:first].sum())
    ivf[start], ivf[start + 1] = ivf[start + 1].clone(), ivf[start].clone()  # one list out of order
    torch.save((ivf, lengths), broken / "ivf.pid.pt")
    with pytest.raises(ValueError, match="ivf.pid.pt.*increasing"):
        synthetic.verify_synthetic_index(broken, progress=False)
