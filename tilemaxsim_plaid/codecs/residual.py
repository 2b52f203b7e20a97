"""colbert-ai's residual codec (PLAID, nbits in {1, 2, 4}): bit layout, decompression, norms.

A document token is stored as a centroid id ``code`` (int32) and ``d * nbits / 8`` residual
bytes. Every dimension k holds an nbits bucket index b_k and the token embedding is

    normalize(centroids[code] + bucket_weights[b])        (one scalar weight per bucket)

Bit layout (colbert/indexing/codecs/residual.py, ``binarize`` + ``np.packbits``): byte j holds
dimensions ``j * (8 // nbits) + s`` for slots s = 0 .. 8 // nbits - 1, slot s in the *field*
``(byte >> (8 - nbits * (s + 1))) & (2**nbits - 1)``. ``binarize`` writes the bucket's bits
least-significant first and ``packbits`` is big-endian, so the field is the bucket index with its
nbits bits reversed. colbert-ai undoes this with ``reversed_bit_map`` followed by
``decompression_lookup_table``; here one table maps a byte straight to its bucket indices.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = [
    "SUPPORTED_NBITS",
    "check_nbits",
    "bucket_table",
    "field_order_weights",
    "unpack_buckets",
    "pack_buckets",
    "decompress_residuals",
    "residual_inverse_norms",
    "compress_residuals",
    "train_bucket_codec",
]

SUPPORTED_NBITS = (1, 2, 4)
# torch.nn.functional.normalize's default: a zero vector stays zero instead of becoming NaN.
NORMALIZE_EPS = 1e-12
# Tokens decoded per step by the torch paths: bounds the [chunk, d] temporaries (colbert-ai
# decompresses in 2**15-token batches for the same reason).
DECODE_CHUNK_TOKENS = 1 << 15
# Tokens assigned to centroids per step by compress_residuals: a [chunk, C] fp16 score matrix
# (fast-plaid's Rust create() steps by 2,048 rows; the argmax of a row does not depend on it).
ENCODE_CHUNK_TOKENS = 1 << 11


def check_nbits(nbits: int, dim: int | None = None) -> None:
    if nbits not in SUPPORTED_NBITS:
        raise ValueError(f"nbits must be one of {SUPPORTED_NBITS}, got {nbits!r}")
    if dim is not None and dim % 8 != 0:
        raise ValueError(f"the embedding dimension must be a multiple of 8, got {dim}")


def _reverse_bits(value: int, nbits: int) -> int:
    return int(format(value, f"0{nbits}b")[::-1], 2)


@functools.lru_cache(maxsize=None)
def _bucket_table_cpu(nbits: int) -> torch.Tensor:
    slots = 8 // nbits
    mask = (1 << nbits) - 1
    table = torch.empty(256, slots, dtype=torch.int64)
    for byte in range(256):
        for s in range(slots):
            field = (byte >> (8 - nbits * (s + 1))) & mask
            table[byte, s] = _reverse_bits(field, nbits)
    return table


def bucket_table(nbits: int, device=None) -> torch.Tensor:
    """[256, 8 // nbits] int64: bucket index of each dimension slot of a residual byte.

    Equal to colbert-ai's ``decompression_lookup_table[reversed_bit_map]``.
    """
    check_nbits(nbits)
    return _bucket_table_cpu(nbits).to(device)


def field_order_weights(bucket_weights: torch.Tensor, nbits: int) -> torch.Tensor:
    """[2**nbits] float32 weights indexed by the raw bit field (``w[reverse_bits(field)]``).

    The kernels select a weight straight from the field's bits, so the bit reversal costs them
    nothing at run time.
    """
    check_nbits(nbits)
    if bucket_weights.numel() != 1 << nbits:
        raise ValueError(
            f"bucket_weights must have 2**nbits = {1 << nbits} entries, got shape "
            f"{tuple(bucket_weights.shape)}"
        )
    order = torch.tensor([_reverse_bits(f, nbits) for f in range(1 << nbits)],
                         device=bucket_weights.device)
    return bucket_weights.reshape(-1).to(torch.float32)[order].contiguous()


def unpack_buckets(residuals: torch.Tensor, nbits: int) -> torch.Tensor:
    """[T, d * nbits / 8] uint8 -> [T, d] int64 bucket indices."""
    table = bucket_table(nbits, residuals.device)
    return table[residuals.long()].reshape(residuals.shape[0], -1)


def pack_buckets(buckets: torch.Tensor, nbits: int) -> torch.Tensor:
    """Inverse of :func:`unpack_buckets`: [T, d] bucket indices -> [T, d * nbits / 8] uint8.

    Produces the bytes colbert-ai's ``ResidualCodec.binarize`` writes for the same buckets.
    """
    check_nbits(nbits, buckets.shape[-1])
    slots = 8 // nbits
    reversed_field = torch.tensor([_reverse_bits(b, nbits) for b in range(1 << nbits)],
                                  device=buckets.device)
    fields = reversed_field[buckets.long()].reshape(buckets.shape[0], -1, slots)
    shifts = torch.tensor([8 - nbits * (s + 1) for s in range(slots)], device=buckets.device)
    return (fields << shifts).sum(-1).to(torch.uint8)


def _check_codec_inputs(codes, residuals, centroids, bucket_weights, nbits) -> None:
    check_nbits(nbits, centroids.shape[-1])
    if codes.dim() != 1 or residuals.dim() != 2 or codes.shape[0] != residuals.shape[0]:
        raise ValueError(
            f"codes must be [T] and residuals [T, d*nbits/8]; got codes {tuple(codes.shape)}, "
            f"residuals {tuple(residuals.shape)}"
        )
    if residuals.dtype != torch.uint8:
        raise TypeError(f"residuals must be uint8, got {residuals.dtype}")
    if residuals.shape[1] * 8 != centroids.shape[1] * nbits:
        raise ValueError(
            f"residuals has {residuals.shape[1]} bytes per token but d={centroids.shape[1]}, "
            f"nbits={nbits} needs {centroids.shape[1] * nbits // 8}"
        )
    if bucket_weights.numel() != 1 << nbits:
        raise ValueError(f"bucket_weights must have {1 << nbits} entries, got {bucket_weights.numel()}")


def decompress_residuals(
    codes: torch.Tensor,
    residuals: torch.Tensor,
    centroids: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
    normalize: bool = True,
) -> torch.Tensor:
    """Dense token embeddings from residual codes, equal to colbert-ai's ``ResidualCodec.decompress``.

    The sum is taken in the centroids' dtype, as colbert-ai does: fp32 centroids on its CPU path
    (fp32 output), fp16 centroids and fp16 bucket weights on its GPU path (fp16 output).

    Args:
        codes: [T] int32/int64 centroid ids.
        residuals: [T, d * nbits / 8] uint8 in colbert-ai's bit layout.
        centroids: [C, d] float.
        bucket_weights: [2**nbits] float.
        nbits: 1, 2 or 4.
        normalize: L2-normalise each token (colbert-ai always does).

    Returns:
        [T, d] in ``centroids.dtype``.
    """
    _check_codec_inputs(codes, residuals, centroids, bucket_weights, nbits)
    weights = bucket_weights.reshape(-1).to(device=centroids.device, dtype=centroids.dtype)
    table = bucket_table(nbits, centroids.device)
    out = torch.empty(codes.shape[0], centroids.shape[1], dtype=centroids.dtype,
                      device=centroids.device)
    for start in range(0, codes.shape[0], DECODE_CHUNK_TOKENS):
        stop = start + DECODE_CHUNK_TOKENS
        buckets = table[residuals[start:stop].to(centroids.device).long()]
        embeddings = centroids[codes[start:stop].to(centroids.device).long()]
        embeddings += weights[buckets.reshape(embeddings.shape[0], -1)]
        if normalize:
            embeddings = F.normalize(embeddings, p=2, dim=-1, eps=NORMALIZE_EPS)
        out[start:stop] = embeddings
    return out


def residual_inverse_norms(
    codes: torch.Tensor,
    residuals: torch.Tensor,
    centroids: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
) -> torch.Tensor:
    """[T] float32 ``1 / max(||centroids[code] + bucket_weights[b]||, eps)`` per token.

    Computed once when a device index is built and read by :func:`maxsim_residual` (4 bytes per
    token) so that its kernel never needs the centroid row to normalise: with it, the centroid
    part of each score comes from a per-query table (see kernels/maxsim_residual.py). The sum is
    taken in fp32 whatever the centroids' dtype.
    """
    _check_codec_inputs(codes, residuals, centroids, bucket_weights, nbits)
    out = torch.empty(codes.shape[0], dtype=torch.float32, device=centroids.device)
    c32 = centroids.to(torch.float32)
    weights = bucket_weights.reshape(-1).to(device=centroids.device, dtype=torch.float32)
    table = bucket_table(nbits, centroids.device)
    for start in range(0, codes.shape[0], DECODE_CHUNK_TOKENS):
        stop = start + DECODE_CHUNK_TOKENS
        buckets = table[residuals[start:stop].to(centroids.device).long()]
        embeddings = c32[codes[start:stop].to(centroids.device).long()]
        embeddings += weights[buckets.reshape(embeddings.shape[0], -1)]
        out[start:stop] = 1.0 / embeddings.norm(dim=-1).clamp_min(NORMALIZE_EPS)
    return out


def compress_residuals(
    embeddings: torch.Tensor,
    centroids: torch.Tensor,
    bucket_cutoffs: torch.Tensor,
    nbits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual codes of ``embeddings``, as colbert-ai's ``ResidualCodec.compress`` and
    fast-plaid's ``create()`` compute them on the GPU.

    Each token takes the centroid of highest fp16 inner product (``argmax`` of
    ``embeddings @ centroids.T``, first index on ties), its residual ``embedding - centroid``
    is taken in fp16, and every dimension's bucket is ``torch.bucketize(residual, cutoffs)``
    (right=False): the number of cutoffs strictly below the value.

    Args:
        embeddings: [T, d] fp16 (other float dtypes are rounded to fp16 first, as both do).
        centroids: [C, d] fp16.
        bucket_cutoffs: [2**nbits - 1] ascending.
        nbits: 1, 2 or 4.

    Returns:
        ``(codes int64 [T], residuals uint8 [T, d * nbits / 8])`` on ``embeddings.device``.
    """
    check_nbits(nbits, centroids.shape[-1])
    if embeddings.dim() != 2 or embeddings.shape[1] != centroids.shape[1]:
        raise ValueError(f"embeddings must be [T, {centroids.shape[1]}], got {tuple(embeddings.shape)}")
    if bucket_cutoffs.numel() != (1 << nbits) - 1:
        raise ValueError(f"bucket_cutoffs must have {(1 << nbits) - 1} entries, got {bucket_cutoffs.numel()}")
    E = embeddings.to(torch.float16)
    C = centroids.to(device=E.device, dtype=torch.float16)
    cutoffs = bucket_cutoffs.reshape(-1).to(device=E.device, dtype=torch.float32)
    codes = torch.empty(E.shape[0], dtype=torch.int64, device=E.device)
    for start in range(0, E.shape[0], ENCODE_CHUNK_TOKENS):
        codes[start:start + ENCODE_CHUNK_TOKENS] = (E[start:start + ENCODE_CHUNK_TOKENS] @ C.T).argmax(1)
    residuals = torch.empty(E.shape[0], E.shape[1] * nbits // 8, dtype=torch.uint8, device=E.device)
    for start in range(0, E.shape[0], DECODE_CHUNK_TOKENS):
        stop = start + DECODE_CHUNK_TOKENS
        residual = E[start:stop] - C[codes[start:stop]]
        residuals[start:stop] = pack_buckets(torch.bucketize(residual.float(), cutoffs), nbits)
    return codes, residuals


def train_bucket_codec(
    heldout: torch.Tensor,
    centroids: torch.Tensor,
    nbits: int,
) -> dict[str, torch.Tensor]:
    """Bucket cutoffs and weights from held-out token embeddings, by the rule colbert-ai and
    fast-plaid share: cutoffs are the ``i / 2**nbits`` quantiles (i = 1 .. 2**nbits - 1) of all
    residual values, weights the ``(i + 0.5) / 2**nbits`` quantiles, so every bucket is equally
    likely; also the per-dimension mean absolute residual and (fast-plaid) the 0.75 quantile of
    the residual norms.

    Quantiles are order statistics (``kthvalue``, as fast-plaid takes them), so every value is
    one of the fp16 residuals.

    Returns:
        ``{"bucket_cutoffs", "bucket_weights", "avg_residual", "cluster_threshold"}``, fp32.
    """
    codes, _ = compress_residuals(heldout, centroids, torch.zeros((1 << nbits) - 1), nbits)
    residual = (heldout.to(torch.float16) - centroids.to(heldout.device, torch.float16)[codes]).float()
    flat = residual.reshape(-1)

    def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
        k = max(1, min(values.numel(), int(round(q * (values.numel() - 1))) + 1))
        return values.kthvalue(k).values

    levels = 1 << nbits
    return {
        "bucket_cutoffs": torch.stack([quantile(flat, i / levels) for i in range(1, levels)]).cpu(),
        "bucket_weights": torch.stack([quantile(flat, (i + 0.5) / levels) for i in range(levels)]).cpu(),
        "avg_residual": residual.abs().mean(0).cpu(),
        "cluster_threshold": quantile(residual.norm(dim=1), 0.75).reshape(1).cpu(),
    }
