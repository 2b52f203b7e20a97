"""Every ``TILEMAXSIM_PLAID_*`` environment variable: its name, its allowed values, its reader.

Each reader checks the value whatever the backend or device, and a value outside the allowed
set raises ValueError naming the variable and listing what it accepts, so a misspelling is an
error and not a setting silently ignored. Values are read at every call (the benchmarks switch
them in a running process). :func:`check` reads all of them at once; the plugin calls it at the
start of every search.

This module imports nothing but the standard library: the registry reads it at import time.
"""

from __future__ import annotations

import logging
import os

from tilemaxsim_plaid.triton_support import interpreting, triton_problem

logger = logging.getLogger(__name__)

__all__ = [
    "DISABLE_ENV_VAR",
    "BACKEND_ENV_VAR",
    "PRODUCTS_ENV_VAR",
    "GRAPHS_ENV_VAR",
    "BACKENDS",
    "PRODUCTS",
    "plugin_disabled",
    "backend_for",
    "stage_4_products",
    "cuda_graphs_allowed",
    "check",
]

# 1/true/yes/on: `import tilemaxsim_plaid` leaves colbert-ai unpatched.
DISABLE_ENV_VAR = "TILEMAXSIM_PLAID_DISABLE"
# triton|torch: how stages 2-4 are computed (plaid/backends.py); unset: triton on CUDA, torch on CPU.
BACKEND_ENV_VAR = "TILEMAXSIM_PLAID_BACKEND"
# auto|tf32x3|fp16x2|fp16: how the fused stage-4 kernel multiplies the fp32 query (Triton backend).
PRODUCTS_ENV_VAR = "TILEMAXSIM_PLAID_PRODUCTS"
# 0|1 (or the other flag spellings): 0 runs the search path and the query encoder eagerly.
GRAPHS_ENV_VAR = "TILEMAXSIM_PLAID_CUDA_GRAPHS"

BACKENDS = ("triton", "torch")
# How the fused stage-4 kernel multiplies the fp32 query (kernels/maxsim_residual.py):
#   "tf32x3": three tf32 tensor-core products per fp32 product, ~1e-6 per score;
#   "fp16x2": the query's fp16 head and tail against fp16 residual weights (two products);
#   "fp16": the residual part against the query rounded to fp16 once (one product per tile);
#   "auto" (default): fp16x2 where every bucket weight is an fp16 value, else tf32x3.
# Both fp16 modes keep the centroid part in fp32 (the centroid-score table) and round each
# residual weight to fp16. Where the weights are fp16 values already (colbert-ai's GPU codec
# holds them in fp16, so on a GPU they always are) that rounding is exact and fp16x2 rounds
# only the query's tail (2**-22 of the query): tf32x3's accuracy, which is why "auto" takes it.
# Where they are not (a CPU codec keeps fp32 weights), the rounding dominates the error of both
# fp16 modes (tests/plaid/test_search.py states the bound on the test index), still below
# colbert-ai's own GPU path, which rounds the query and every decompressed embedding to fp16.
PRODUCTS = ("auto", "tf32x3", "fp16x2", "fp16")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _read(name: str) -> str:
    return os.environ.get(name, "").strip().lower()


def _flag(name: str, default: bool) -> bool:
    value = _read(name)
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be one of {_TRUE + _FALSE} (or unset), got {os.environ[name]!r}")


def plugin_disabled() -> bool:
    """Whether :data:`DISABLE_ENV_VAR` asks ``import tilemaxsim_plaid`` not to patch colbert-ai."""
    return _flag(DISABLE_ENV_VAR, False)


def backend_for(device) -> str:
    """``"triton"`` or ``"torch"`` for tensors on ``device`` (a ``torch.device``).

    Default: triton on CUDA where triton is installed, torch elsewhere (a CUDA machine without
    triton, e.g. Windows, serves with the exact torch path, said once at INFO).
    :data:`BACKEND_ENV_VAR` overrides it; ``triton`` needs triton installed, and for CPU tensors
    is accepted only under ``TRITON_INTERPRET=1`` (the tests), since Triton kernels run on a GPU.
    """
    choice = _read(BACKEND_ENV_VAR)
    if choice and choice not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV_VAR} must be one of {BACKENDS} (or unset), "
                         f"got {os.environ[BACKEND_ENV_VAR]!r}")
    if choice == "triton" and device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{BACKEND_ENV_VAR}=triton needs the index on a CUDA device, but it is on {device}: "
            f"Triton kernels run on a GPU (on the CPU only under TRITON_INTERPRET=1, for tests). "
            f"Unset {BACKEND_ENV_VAR} or set it to 'torch'."
        )
    if choice == "triton" and not _triton_installed():
        raise ValueError(f"{BACKEND_ENV_VAR}=triton needs triton: {triton_problem()}; install one "
                         f"or unset {BACKEND_ENV_VAR} to serve with the torch path")
    if choice:
        return choice
    if device.type != "cuda":
        return "torch"
    if not _triton_installed():
        if not _said_no_triton:
            _said_no_triton.append(True)
            logger.info("%s: the plugin scores CUDA tensors with its exact torch path",
                        triton_problem())
        return "torch"
    return "triton"


_said_no_triton: list[bool] = []


def _triton_installed() -> bool:
    """A triton the kernels build with is installed (triton_support)."""
    return triton_problem() is None


def stage_4_products() -> str:
    """One of :data:`PRODUCTS` (see the comment there; ``"auto"`` when unset)."""
    choice = _read(PRODUCTS_ENV_VAR) or "auto"
    if choice not in PRODUCTS:
        raise ValueError(f"{PRODUCTS_ENV_VAR} must be one of {PRODUCTS} (or unset), "
                         f"got {os.environ[PRODUCTS_ENV_VAR]!r}")
    return choice


def cuda_graphs_allowed() -> bool:
    """False when :data:`GRAPHS_ENV_VAR` turns the plugin's CUDA graphs off (default: on)."""
    return _flag(GRAPHS_ENV_VAR, True)


def check(device) -> None:
    """Read every variable for an index on ``device``; raises ValueError on the first bad one."""
    plugin_disabled()
    backend_for(device)
    stage_4_products()
    cuda_graphs_allowed()
