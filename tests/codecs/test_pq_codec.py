"""PQCodec: training (faiss and torch), encode/decode, save/load, and table scoring."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.codecs import pq as pq_module
from tilemaxsim_plaid.codecs.pq import PQCodec, assign_centroids
from tilemaxsim_plaid.ops.pq import maxsim_pq

DIM, NUM_SUBQUANTIZERS, NUM_TRAIN = 32, 8, 600


def clustered_vectors(n: int, dim: int = DIM, num_clusters: int = 12) -> torch.Tensor:
    """Unit vectors around a few directions, like token embeddings (not isotropic noise)."""
    centers = F.normalize(torch.randn(num_clusters, dim), dim=-1)
    which = torch.randint(0, num_clusters, (n,))
    return F.normalize(centers[which] + 0.3 * torch.randn(n, dim) / dim**0.5, dim=-1)


@pytest.fixture(scope="module")
def training_vectors():
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    x = clustered_vectors(NUM_TRAIN)
    torch.random.set_rng_state(generator_state)
    return x


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_round_trip_and_error(training_vectors, backend):
    if backend == "faiss":
        pytest.importorskip("faiss", reason="faiss is optional (pip install .[colbert])")
    codec = PQCodec.train(training_vectors, NUM_SUBQUANTIZERS, niter=8, backend=backend)
    assert codec.trained_with == backend
    assert codec.codebooks.shape == (NUM_SUBQUANTIZERS, 256, DIM // NUM_SUBQUANTIZERS)
    codes = codec.encode(training_vectors)
    assert codes.dtype == torch.uint8 and codes.shape == (NUM_TRAIN, NUM_SUBQUANTIZERS)
    decoded = codec.decode(codes)
    # A decoded vector is made of codewords, so it encodes back to the same codes.
    assert torch.equal(codec.encode(decoded), codes)
    # Far better than the best constant (the mean): k-means fit the data.
    mse = ((decoded - training_vectors) ** 2).sum(-1).mean()
    baseline = ((training_vectors - training_vectors.mean(0)) ** 2).sum(-1).mean()
    assert mse < 0.25 * baseline


def test_fallback_is_logged(training_vectors, monkeypatch, caplog):
    monkeypatch.setattr(pq_module, "_faiss_unavailable_reason", lambda: "faiss is not importable (test)")
    with caplog.at_level(logging.WARNING, logger=pq_module.__name__):
        codec = PQCodec.train(training_vectors, NUM_SUBQUANTIZERS, niter=2)
    assert codec.trained_with == "torch"
    assert "faiss is not importable" in caplog.text


def test_residual_mode(training_vectors):
    centroids = F.normalize(torch.randn(16, DIM), dim=-1)
    codec = PQCodec.train(training_vectors, NUM_SUBQUANTIZERS, centroids=centroids, niter=5,
                          backend="torch")
    assert codec.on_residuals
    centroid_codes = assign_centroids(training_vectors, centroids)
    codes = codec.encode(training_vectors, centroid_codes)
    decoded = codec.decode(codes, centroid_codes)
    expected = centroids[centroid_codes.long()] + PQCodec(codec.codebooks).decode(codes)
    torch.testing.assert_close(decoded, expected)
    with pytest.raises(ValueError, match="centroid_codes"):
        codec.encode(training_vectors)


def test_save_load(tmp_path, training_vectors):
    codec = PQCodec.train(training_vectors, NUM_SUBQUANTIZERS, niter=2, backend="torch",
                          centroids=F.normalize(torch.randn(4, DIM), dim=-1))
    path = tmp_path / "pq.pt"
    codec.save(path)
    loaded = PQCodec.load(path)
    assert torch.equal(loaded.codebooks, codec.codebooks)
    assert torch.equal(loaded.centroids, codec.centroids)
    assert loaded.trained_with == codec.trained_with


def test_bad_training_input():
    with pytest.raises(ValueError, match="divide"):
        PQCodec.train(torch.randn(300, 30), 8)
    with pytest.raises(ValueError, match="at least 256"):
        PQCodec.train(torch.randn(100, 32), 8)


def lookup_table_scores(Q, codes, offsets, codebooks):
    """Textbook PQ scoring: LUT[i, m, k] = <q_i^(m), codebooks[m, k]>, token score = sum_m LUT."""
    M = codebooks.shape[0]
    Qs = Q.double().reshape(Q.shape[0], M, -1)  # [Lq, M, dsub]
    lut = torch.einsum("imd,mkd->imk", Qs, codebooks.double())  # [Lq, M, 256]
    token_scores = lut[:, torch.arange(M)[None, :], codes.long()].sum(-1)  # [Lq, T]
    scores = []
    for n in range(offsets.numel() - 1):
        part = token_scores[:, int(offsets[n]):int(offsets[n + 1])]
        scores.append(part.max(dim=1).values.sum() if part.shape[1] else torch.tensor(float("-inf")))
    return torch.stack(scores)


def test_table_scoring_equals_decoded_maxsim_and_kernel(training_vectors, device):
    codec = PQCodec.train(training_vectors, NUM_SUBQUANTIZERS, niter=5, backend="torch")
    codes = codec.encode(training_vectors)
    offsets = torch.tensor([0, 7, 7, 40, 41, 120], dtype=torch.int64)
    codes = codes[: int(offsets[-1])]
    Q = clustered_vectors(13).half()
    by_table = lookup_table_scores(Q, codes, offsets, codec.codebooks)
    by_decoding = reference.maxsim_packed(Q, codec.decode(codes).double(), offsets)
    torch.testing.assert_close(by_table, by_decoding, rtol=1e-12, atol=1e-12)
    out = maxsim_pq(Q.to(device), codes.to(device), offsets.to(device), codec.codebooks.to(device))
    assert_close(out, by_decoding, "maxsim_pq", torch.float16)
