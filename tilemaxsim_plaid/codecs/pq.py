"""Product quantization of token embeddings (or of PLAID residuals): M sub-quantizers x 256 codes.

A d-dimensional vector is cut into M sub-vectors of d / M dimensions; each is replaced by the id
(one byte) of its nearest of 256 centroids, trained per sub-space with k-means. A token costs M
bytes: 16 at M = 16 against 256 for fp16 at d = 128.

Two modes:
* on embeddings: x ~ concat_m codebooks[m, code[m]].
* on PLAID residuals: x ~ centroids[c] + concat_m codebooks[m, code[m]], where c is the token's
  PLAID centroid (its nearest centroid by inner product, as colbert-ai assigns them) and the
  codebooks are trained on x - centroids[c].

Training uses faiss (``faiss.ProductQuantizer``) when it imports, else a torch k-means with the
same objective, and says which in a log line. Encoding and decoding are torch in both cases, so a
saved codec behaves the same wherever it is loaded.
"""

from __future__ import annotations

import logging
import math
import os

import torch

__all__ = ["PQCodec", "CODEBOOK_SIZE", "assign_centroids"]

logger = logging.getLogger(__name__)

CODEBOOK_SIZE = 256
# faiss's own default cap per centroid (max_points_per_centroid): more points add time, not quality.
MAX_POINTS_PER_CENTROID = 256
# Rows per step when encoding / assigning: bounds the [rows, 256] distance block.
ENCODE_CHUNK = 1 << 16


def _nearest_codewords(sub: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """[n, dsub], [256, dsub] -> [n] int64 index of the nearest codeword in L2."""
    # ||x - c||^2 = ||x||^2 - 2 <x, c> + ||c||^2; ||x||^2 is the same for every c.
    distances = (codebook * codebook).sum(-1)[None, :] - 2.0 * (sub @ codebook.T)
    return distances.argmin(dim=1)


def _kmeans_torch(x: torch.Tensor, k: int, niter: int, generator: torch.Generator) -> torch.Tensor:
    """Lloyd's k-means in fp32: [n, dsub] -> [k, dsub] centroids. Empty clusters are re-seeded
    with random points (faiss splits the largest cluster instead; both keep all k codewords in use)."""
    n = x.shape[0]
    init = torch.randperm(n, generator=generator)[:k].to(x.device)
    centroids = x[init].clone()
    for _ in range(niter):
        assign = torch.cat([_nearest_codewords(x[i:i + ENCODE_CHUNK], centroids)
                            for i in range(0, n, ENCODE_CHUNK)])
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype)
        empty = counts == 0
        centroids = torch.where(empty[:, None], centroids, sums / counts.clamp_min(1)[:, None])
        if bool(empty.any()):
            reseed = torch.randint(0, n, (int(empty.sum()),), generator=generator).to(x.device)
            centroids[empty] = x[reseed]
    return centroids


def _train_faiss(x: torch.Tensor, num_subquantizers: int, niter: int, seed: int) -> torch.Tensor:
    import faiss
    import numpy as np

    dim = x.shape[1]
    pq = faiss.ProductQuantizer(dim, num_subquantizers, int(math.log2(CODEBOOK_SIZE)))
    pq.cp.niter = niter
    pq.cp.seed = seed
    pq.cp.max_points_per_centroid = MAX_POINTS_PER_CENTROID
    pq.verbose = False
    pq.train(np.ascontiguousarray(x.cpu().numpy(), dtype=np.float32))
    books = faiss.vector_to_array(pq.centroids).reshape(num_subquantizers, CODEBOOK_SIZE, -1)
    return torch.from_numpy(books.copy())


def _faiss_unavailable_reason() -> str | None:
    try:
        import faiss  # noqa: F401
    except ImportError as error:
        return f"faiss is not importable ({error})"
    return None


class PQCodec:
    """A trained product quantizer.

    Attributes:
        codebooks: [M, 256, d / M] float32.
        centroids: [C, d] float32 PLAID centroids when the codec quantizes residuals, else None.
        trained_with: "faiss" or "torch".
    """

    def __init__(self, codebooks: torch.Tensor, centroids: torch.Tensor | None = None,
                 trained_with: str = "unknown"):
        if codebooks.dim() != 3 or codebooks.shape[1] != CODEBOOK_SIZE:
            raise ValueError(f"codebooks must be [M, {CODEBOOK_SIZE}, d/M], got {tuple(codebooks.shape)}")
        if centroids is not None and centroids.shape[1] != codebooks.shape[0] * codebooks.shape[2]:
            raise ValueError(f"centroids must be [C, d={codebooks.shape[0] * codebooks.shape[2]}], "
                             f"got {tuple(centroids.shape)}")
        self.codebooks = codebooks.to(torch.float32).contiguous()
        self.centroids = None if centroids is None else centroids.to(torch.float32).contiguous()
        self.trained_with = trained_with

    @property
    def num_subquantizers(self) -> int:
        return self.codebooks.shape[0]

    @property
    def sub_dim(self) -> int:
        return self.codebooks.shape[2]

    @property
    def dim(self) -> int:
        return self.num_subquantizers * self.sub_dim

    @property
    def on_residuals(self) -> bool:
        return self.centroids is not None

    def to(self, device) -> PQCodec:
        return PQCodec(self.codebooks.to(device),
                       None if self.centroids is None else self.centroids.to(device),
                       self.trained_with)

    @classmethod
    def train(cls, vectors: torch.Tensor, num_subquantizers: int, *,
              centroids: torch.Tensor | None = None, centroid_codes: torch.Tensor | None = None,
              niter: int = 25, seed: int = 0, backend: str = "auto") -> PQCodec:
        """Train M x 256 codebooks on ``vectors`` (or on their PLAID residuals).

        Args:
            vectors: [n, d] float training vectors, n >= 256.
            num_subquantizers: M, a divisor of d.
            centroids: optional [C, d] PLAID centroids: train on ``vectors - centroids[code]``.
            centroid_codes: optional [n] centroid of each vector (PLAID's codes); computed as the
                nearest centroid by inner product when omitted.
            niter: k-means iterations per sub-space.
            seed: k-means seed.
            backend: "faiss", "torch" or "auto" (faiss when importable).

        Returns:
            The trained codec (its tensors on ``vectors.device``).
        """
        if vectors.dim() != 2:
            raise ValueError(f"vectors must be [n, d], got {tuple(vectors.shape)}")
        n, dim = vectors.shape
        if num_subquantizers < 1 or dim % num_subquantizers:
            raise ValueError(f"num_subquantizers must divide d={dim}, got {num_subquantizers}")
        if n < CODEBOOK_SIZE:
            raise ValueError(f"PQ training needs at least {CODEBOOK_SIZE} vectors, got {n}")
        if backend not in ("auto", "faiss", "torch"):
            raise ValueError(f"backend must be 'auto', 'faiss' or 'torch', got {backend!r}")
        x = vectors.to(torch.float32)
        if centroids is not None:
            if centroid_codes is None:
                centroid_codes = assign_centroids(x, centroids)
            x = x - centroids.to(x.device, torch.float32)[centroid_codes.to(x.device).long()]
        generator = torch.Generator().manual_seed(seed)
        # Subsample like faiss does, so both backends see the same number of points.
        cap = MAX_POINTS_PER_CENTROID * CODEBOOK_SIZE
        if n > cap:
            x = x[torch.randperm(n, generator=generator)[:cap].to(x.device)]
        reason = _faiss_unavailable_reason()
        if backend == "faiss" and reason:
            raise ImportError(reason)
        if backend == "torch" or reason:
            if backend == "auto":
                logger.warning("PQ training with torch k-means: %s", reason)
            sub = x.reshape(x.shape[0], num_subquantizers, -1)
            books = torch.stack([_kmeans_torch(sub[:, m].contiguous(), CODEBOOK_SIZE, niter,
                                               generator) for m in range(num_subquantizers)])
            trained_with = "torch"
        else:
            books = _train_faiss(x, num_subquantizers, niter, seed).to(x.device)
            trained_with = "faiss"
        logger.info("trained PQ codec: M=%d, d=%d, %d vectors, backend %s%s", num_subquantizers,
                    dim, x.shape[0], trained_with, ", on PLAID residuals" if centroids is not None else "")
        return cls(books, centroids, trained_with)

    def _residual_targets(self, vectors: torch.Tensor, centroid_codes) -> torch.Tensor:
        x = vectors.to(self.codebooks.device, torch.float32)
        if self.centroids is None:
            if centroid_codes is not None:
                raise ValueError("centroid_codes given but this codec quantizes embeddings")
            return x
        if centroid_codes is None:
            raise ValueError("this codec quantizes PLAID residuals: pass centroid_codes "
                             "(PLAID's codes, or assign_centroids(vectors, codec.centroids))")
        return x - self.centroids[centroid_codes.to(x.device).long()]

    def encode(self, vectors: torch.Tensor, centroid_codes: torch.Tensor | None = None) -> torch.Tensor:
        """[n, d] float -> [n, M] uint8 codes (of the residuals from ``centroid_codes`` when the
        codec quantizes residuals). Works in chunks of rows, so fp16 inputs of any size are fine."""
        if vectors.dim() != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must be [n, d={self.dim}], got {tuple(vectors.shape)}")
        if self.centroids is not None and centroid_codes is None:
            raise ValueError("this codec quantizes PLAID residuals: pass centroid_codes "
                             "(PLAID's codes, or assign_centroids(vectors, codec.centroids))")
        n = vectors.shape[0]
        codes = torch.empty(n, self.num_subquantizers, dtype=torch.uint8, device=self.codebooks.device)
        for i in range(0, n, ENCODE_CHUNK):
            x = self._residual_targets(
                vectors[i:i + ENCODE_CHUNK],
                None if centroid_codes is None else centroid_codes[i:i + ENCODE_CHUNK])
            sub = x.reshape(x.shape[0], self.num_subquantizers, self.sub_dim)
            for m in range(self.num_subquantizers):
                codes[i:i + ENCODE_CHUNK, m] = _nearest_codewords(
                    sub[:, m], self.codebooks[m]).to(torch.uint8)
        return codes

    def decode(self, codes: torch.Tensor, centroid_codes: torch.Tensor | None = None) -> torch.Tensor:
        """[n, M] uint8 -> [n, d] float32 (plus ``centroids[centroid_codes]`` in residual mode)."""
        if codes.dim() != 2 or codes.shape[1] != self.num_subquantizers:
            raise ValueError(f"codes must be [n, M={self.num_subquantizers}], got {tuple(codes.shape)}")
        books = self.codebooks
        m = torch.arange(self.num_subquantizers, device=books.device)
        out = books[m[None, :], codes.to(books.device).long()].reshape(codes.shape[0], self.dim)
        if self.centroids is not None:
            if centroid_codes is None:
                raise ValueError("this codec quantizes PLAID residuals: pass centroid_codes")
            out = out + self.centroids[centroid_codes.to(books.device).long()]
        return out

    def inverse_norms(self, codes: torch.Tensor, centroid_codes: torch.Tensor | None = None) -> torch.Tensor:
        """[n] float32 1 / ||decode(codes)||: pass to maxsim_pq to score normalized decoded vectors."""
        out = torch.empty(codes.shape[0], dtype=torch.float32, device=self.codebooks.device)
        for i in range(0, codes.shape[0], ENCODE_CHUNK):
            part = self.decode(codes[i:i + ENCODE_CHUNK],
                               None if centroid_codes is None else centroid_codes[i:i + ENCODE_CHUNK])
            out[i:i + ENCODE_CHUNK] = 1.0 / part.norm(dim=-1).clamp_min(1e-12)
        return out

    def save(self, path: str | os.PathLike) -> None:
        torch.save({"codebooks": self.codebooks.cpu(),
                    "centroids": None if self.centroids is None else self.centroids.cpu(),
                    "trained_with": self.trained_with}, path)

    @classmethod
    def load(cls, path: str | os.PathLike, device=None) -> PQCodec:
        state = torch.load(path, map_location="cpu", weights_only=True)
        codec = cls(state["codebooks"], state["centroids"], state["trained_with"])
        return codec.to(device) if device is not None else codec


def assign_centroids(vectors: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """[n] int32 nearest centroid by inner product (colbert-ai's ``compress_into_codes``)."""
    c = centroids.to(vectors.device, torch.float32)
    out = torch.empty(vectors.shape[0], dtype=torch.int32, device=vectors.device)
    for i in range(0, vectors.shape[0], ENCODE_CHUNK):
        out[i:i + ENCODE_CHUNK] = (vectors[i:i + ENCODE_CHUNK].to(torch.float32) @ c.T).argmax(1)
    return out
