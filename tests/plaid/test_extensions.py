"""The torch stand-ins for colbert-ai's compiled extensions return what the extensions return.

CPU extensions are compared with the real compiled ones on the tiny index; the two CUDA-only
ones (no GPU here) with colbert-ai's own CPU code for the same computation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")

from tests.plaid.conftest import stock_colbert  # noqa: E402
from tilemaxsim_plaid.plaid import extensions  # noqa: E402

pytestmark = pytest.mark.colbert


@pytest.fixture(scope="module")
def compiled(tiny_searcher):
    """The real compiled CPU extensions, as colbert-ai loads them."""
    from colbert.modeling.colbert import ColBERT
    from colbert.search.index_storage import IndexScorer
    from colbert.search.strided_tensor import StridedTensor

    with stock_colbert():
        return dict(
            filter_pids=IndexScorer.filter_pids,
            decompress_residuals=IndexScorer.decompress_residuals,
            segmented_lookup=StridedTensor.segmented_lookup,
            segmented_maxsim=ColBERT.segmented_maxsim,
        )


def test_cpu_decompression_and_lookup_match_the_compiled_extensions(tiny_searcher, compiled):
    ranker, codec = tiny_searcher.ranker, tiny_searcher.ranker.codec
    pids = torch.tensor([5, 0, 299, 17, 5], dtype=torch.int32)
    args = (pids, ranker.doclens, ranker.offsets, codec.bucket_weights, codec.reversed_bit_map,
            codec.decompression_lookup_table, ranker.embeddings.residuals, ranker.embeddings.codes,
            codec.centroids, codec.dim, codec.nbits)
    assert torch.equal(extensions.decompress_residuals_cpu(*args), compiled["decompress_residuals"](*args))
    lengths, offsets = ranker.doclens[pids.long()], ranker.offsets[pids.long()]
    for packed in (ranker.embeddings.codes, ranker.embeddings.residuals):
        expected = compiled["segmented_lookup"](packed, pids.long(), lengths, offsets)
        assert torch.equal(extensions.segmented_lookup(packed, pids.long(), lengths, offsets), expected)


def test_segmented_maxsim_keeps_the_floor_at_zero(compiled):
    scores = torch.randn(23, 32)
    lengths = torch.tensor([1, 0, 7, 15])
    expected = compiled["segmented_maxsim"](scores, lengths)
    torch.testing.assert_close(extensions.segmented_maxsim(scores, lengths), expected)
    assert float(expected[1]) == 0.0  # an empty document: every floored maximum is 0


@pytest.mark.parametrize("ndocs", [256, 40])
def test_filter_pids_matches_the_compiled_extension(tiny_searcher, tiny_query_embeddings, compiled, ndocs):
    ranker = tiny_searcher.ranker
    Q = tiny_query_embeddings[2]
    centroid_scores = ranker.codec.centroids @ Q.T
    keep = centroid_scores.max(-1).values >= 0.45
    pids = torch.arange(300, dtype=torch.int32)
    args = (pids, centroid_scores, ranker.embeddings.codes, ranker.doclens, ranker.offsets, keep, ndocs)
    expected = compiled["filter_pids"](*args)
    actual = extensions.filter_pids_cpu(*args)
    assert actual.dtype == torch.int32
    # Same candidates, best first; float ties may break differently (summation order).
    assert set(actual.tolist()) == set(expected.tolist())


def test_gpu_decompression_matches_colbert_cpu_decompression(tiny_searcher):
    from colbert.indexing.codecs.residual_embeddings import ResidualEmbeddings

    codec = tiny_searcher.ranker.codec
    codes = tiny_searcher.ranker.embeddings.codes[:777]
    residuals = tiny_searcher.ranker.embeddings.residuals[:777]
    # fp32 tables: colbert's CPU branch adds in fp32, so the stand-in must agree exactly.
    raw = extensions.decompress_residuals_gpu(residuals, codec.bucket_weights, codec.reversed_bit_map,
                                              codec.decompression_lookup_table, codes, codec.centroids,
                                              codec.dim, codec.nbits)
    expected = codec.decompress(ResidualEmbeddings(codes, residuals))
    torch.testing.assert_close(torch.nn.functional.normalize(raw, dim=-1), expected, rtol=0, atol=0)
    half = extensions.decompress_residuals_gpu(residuals, codec.bucket_weights.half(), codec.reversed_bit_map,
                                               codec.decompression_lookup_table, codes, codec.centroids.half(),
                                               codec.dim, codec.nbits)
    assert half.dtype == torch.float16
    # decompress_residuals.cu: output = fp16 weight, then += fp16 centroid (one fp16 rounding).
    buckets = codec.decompression_lookup_table[codec.reversed_bit_map[residuals.long()].long()]
    buckets = buckets.reshape(residuals.shape[0], codec.dim).long()
    assert torch.equal(half, codec.bucket_weights.half()[buckets] + codec.centroids.half()[codes.long()])


@pytest.mark.parametrize("size", [32, 4096])
def test_packbits_matches_numpy(size):
    bits = torch.randint(0, 2, (size,), dtype=torch.uint8)
    assert torch.equal(extensions.packbits_gpu(bits), torch.from_numpy(np.packbits(bits.numpy())))
