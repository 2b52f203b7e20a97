"""TileMaxSim-PLAID: IO-aware Triton MaxSim kernels and a one-import scorer for ColBERTv2/PLAID.

Importing the package patches colbert-ai's PLAID candidate scoring when colbert-ai is installed
(set ``TILEMAXSIM_PLAID_DISABLE=1`` to opt out); :func:`disable` restores colbert-ai exactly.
"""

from tilemaxsim_plaid.codecs import PQCodec, decompress_residuals, residual_inverse_norms
from tilemaxsim_plaid.ops.dense import MaxSimConfig, maxsim_packed, maxsim_padded
from tilemaxsim_plaid.ops.pq import PQConfig, maxsim_pq
from tilemaxsim_plaid.ops.residual import ResidualConfig, maxsim_residual
from tilemaxsim_plaid.plaid import disable, enable, enabled, is_enabled
from tilemaxsim_plaid.plaid import auto_enable as _auto_enable

__version__ = "0.1.0"

__all__ = [
    "MaxSimConfig",
    "PQCodec",
    "PQConfig",
    "ResidualConfig",
    "decompress_residuals",
    "disable",
    "enable",
    "enabled",
    "is_enabled",
    "maxsim_packed",
    "maxsim_padded",
    "maxsim_pq",
    "maxsim_residual",
    "residual_inverse_norms",
    "__version__",
]

_auto_enable()
