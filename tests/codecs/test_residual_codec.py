"""colbert-ai's residual bit layout: our tables, packing and decompression against colbert-ai's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_maxsim_residual import load_plaid_index
from tilemaxsim_plaid.codecs.residual import (
    bucket_table,
    decompress_residuals,
    field_order_weights,
    pack_buckets,
    residual_inverse_norms,
    unpack_buckets,
)

NBITS = [pytest.param(n, id=f"nbits{n}") for n in (1, 2, 4)]


def colbert_codec(dim: int, nbits: int, num_centroids: int = 64):
    """A CPU colbert-ai ResidualCodec with random unit centroids and sorted bucket parameters."""
    from colbert.indexing.codecs.residual import ResidualCodec
    from colbert.infra.config import ColBERTConfig

    centroids = F.normalize(torch.randn(num_centroids, dim), dim=-1)
    cutoffs = torch.sort(torch.randn((1 << nbits) - 1) * 0.05).values
    weights = torch.sort(torch.randn(1 << nbits) * 0.05).values
    return ResidualCodec(ColBERTConfig(dim=dim, nbits=nbits), centroids, avg_residual=0.05,
                         bucket_cutoffs=cutoffs, bucket_weights=weights)


@pytest.mark.parametrize("nbits", NBITS)
def test_pack_unpack_round_trip(nbits):
    buckets = torch.randint(0, 1 << nbits, (9, 96))
    packed = pack_buckets(buckets, nbits)
    assert packed.dtype == torch.uint8 and packed.shape == (9, 96 * nbits // 8)
    assert torch.equal(unpack_buckets(packed, nbits), buckets)


@pytest.mark.parametrize("nbits", NBITS)
def test_field_order_weights_undo_the_bit_reversal(nbits):
    weights = torch.randn(1 << nbits)
    by_field = field_order_weights(weights, nbits)
    # A byte whose first slot holds bucket b has field (byte >> (8 - nbits)) in that slot.
    for bucket in range(1 << nbits):
        byte = pack_buckets(torch.full((1, 8), bucket), nbits)[0, 0].item()
        assert by_field[byte >> (8 - nbits)] == weights[bucket]


@pytest.mark.colbert
@pytest.mark.parametrize("nbits", NBITS)
def test_bucket_table_equals_colbert_lookup(nbits):
    codec = colbert_codec(128, nbits)
    theirs = codec.decompression_lookup_table[codec.reversed_bit_map.long()].long()
    assert torch.equal(bucket_table(nbits), theirs)


@pytest.mark.colbert
@pytest.mark.parametrize("nbits", NBITS)
@pytest.mark.parametrize("dim", [pytest.param(d, id=f"d{d}") for d in (96, 128, 384)])
def test_compress_then_decompress_equals_colbert(nbits, dim):
    codec = colbert_codec(dim, nbits)
    x = F.normalize(torch.randn(200, dim), dim=-1)
    embeddings = codec.compress(x)
    theirs = codec.decompress(embeddings)
    ours = decompress_residuals(embeddings.codes, embeddings.residuals, codec.centroids,
                                codec.bucket_weights, nbits)
    assert torch.equal(ours, theirs)
    # packbits wrote exactly what pack_buckets writes for the buckets binarize chose.
    chosen = torch.bucketize(x - codec.centroids[embeddings.codes.long()], codec.bucket_cutoffs)
    assert torch.equal(pack_buckets(chosen, nbits), embeddings.residuals)
    assert torch.equal(unpack_buckets(embeddings.residuals, nbits), chosen)


def test_fp16_path_follows_colbert_gpu_arithmetic():
    """colbert-ai's CUDA decompression writes fp16(weight) then adds the fp16 centroid in fp16,
    and normalises the fp16 result; with fp16 centroids ours does the same operations."""
    nbits, dim = 2, 128
    centroids = F.normalize(torch.randn(50, dim), dim=-1).half()
    weights = torch.sort(torch.randn(4) * 0.05).values
    codes = torch.randint(0, 50, (300,), dtype=torch.int32)
    residuals = torch.randint(0, 256, (300, dim * nbits // 8), dtype=torch.uint8)
    buckets = unpack_buckets(residuals, nbits)
    theirs = weights.half()[buckets]
    theirs += centroids[codes.long()]
    theirs = F.normalize(theirs, p=2, dim=-1)
    ours = decompress_residuals(codes, residuals, centroids, weights, nbits)
    assert ours.dtype == torch.float16
    assert torch.equal(ours, theirs)


@pytest.mark.colbert
def test_real_index_decompression_and_norms(tiny_plaid_index):
    codec, codes, residuals, offsets = load_plaid_index(tiny_plaid_index.index_path)
    from colbert.indexing.codecs.residual_embeddings import ResidualEmbeddings

    theirs = codec.decompress(ResidualEmbeddings(codes, residuals))
    ours = decompress_residuals(codes, residuals, codec.centroids, codec.bucket_weights,
                                tiny_plaid_index.nbits)
    assert torch.equal(ours, theirs)
    raw = decompress_residuals(codes, residuals, codec.centroids, codec.bucket_weights,
                               tiny_plaid_index.nbits, normalize=False)
    inv_norms = residual_inverse_norms(codes, residuals, codec.centroids, codec.bucket_weights,
                                       tiny_plaid_index.nbits)
    torch.testing.assert_close(raw * inv_norms[:, None], theirs, rtol=1e-6, atol=1e-6)
    assert int(offsets[-1]) == codes.numel() == residuals.shape[0]
