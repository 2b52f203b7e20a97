"""Token codecs: colbert-ai's residual codes (PLAID) and product quantization."""

from tilemaxsim_plaid.codecs.pq import PQCodec, assign_centroids
from tilemaxsim_plaid.codecs.residual import (
    bucket_table,
    decompress_residuals,
    field_order_weights,
    pack_buckets,
    residual_inverse_norms,
    unpack_buckets,
)

__all__ = [
    "PQCodec",
    "assign_centroids",
    "bucket_table",
    "decompress_residuals",
    "field_order_weights",
    "pack_buckets",
    "residual_inverse_norms",
    "unpack_buckets",
]
