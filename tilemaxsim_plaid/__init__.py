"""TileMaxSim-PLAID: IO-aware Triton MaxSim kernels and a one-import scorer for ColBERTv2/PLAID.

Importing the package patches colbert-ai's PLAID candidate scoring: at once if colbert-ai is
imported already, otherwise as soon as it is (set ``TILEMAXSIM_PLAID_DISABLE=1`` to opt out);
:func:`disable` restores colbert-ai exactly, :func:`stats` counts what the plugin did. The
import itself is cheap: it imports neither colbert-ai nor torch, and the kernels' names below
are loaded on first use.
"""

import importlib

from tilemaxsim_plaid.plaid import disable, enable, enabled, is_enabled, stats
from tilemaxsim_plaid.plaid import auto_enable as _auto_enable

__version__ = "0.1.0"

# Public name -> the module defining it, imported on first access (the ops import triton).
_LAZY = {
    "MaxSimConfig": "tilemaxsim_plaid.ops.dense",
    "maxsim_packed": "tilemaxsim_plaid.ops.dense",
    "maxsim_padded": "tilemaxsim_plaid.ops.dense",
    "PQConfig": "tilemaxsim_plaid.ops.pq",
    "maxsim_pq": "tilemaxsim_plaid.ops.pq",
    "ResidualConfig": "tilemaxsim_plaid.ops.residual",
    "maxsim_residual": "tilemaxsim_plaid.ops.residual",
    "PQCodec": "tilemaxsim_plaid.codecs",
    "decompress_residuals": "tilemaxsim_plaid.codecs",
    "residual_inverse_norms": "tilemaxsim_plaid.codecs",
}

# Submodules that importing the package used to load, reachable as attributes on first use.
_SUBPACKAGES = ("codecs", "kernels", "ops", "reference")

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
    "stats",
    "__version__",
]


def _import(name: str, module: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if (error.name or "").partition(".")[0] != "triton":
            raise
        # Where triton has no wheel (it publishes Linux wheels only) or is older than the
        # kernels need, the package and the plugin's exact torch path work; only the kernels
        # need it (triton_support).
        raise ImportError(
            f"{__name__}.{name} needs triton, which cannot be used here ({error}). The "
            f"colbert-ai plugin still serves with its exact torch path.",
            name="triton",
        ) from error


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return _import(name, f"{__name__}.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import(name, module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


_auto_enable()
