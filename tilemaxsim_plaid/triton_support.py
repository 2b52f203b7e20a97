"""Whether the installed triton can build the kernels, told without importing it.

Triton publishes wheels for Linux only, and the kernels need triton 3.3 or later: triton 3.2 and
earlier cannot compile them (kernel code that builds tuples, as the held query does). Where
either is missing, the package and the colbert-ai plugin's exact torch path still work, and the
kernels raise an ImportError that says which (``tilemaxsim_plaid.kernels``). CI compiles every
GPU path under the oldest release supported and under the GPU's (.ci/triton-oldest,
.ci/triton-gpu-version).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys

MIN_TRITON = (3, 3)


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "3.3.1" or "3.4.0+git1234"."""
    major, _, rest = text.partition(".")
    minor = ""
    for char in rest:
        if not char.isdigit():
            break
        minor += char
    return int(major), int(minor or 0)


@functools.cache
def triton_version() -> tuple[int, int] | None:
    """(major, minor) of the installed triton, or None where it cannot be imported."""
    try:
        if importlib.util.find_spec("triton") is None:
            return None
    except ValueError:  # sys.modules["triton"] is None: made unimportable
        return None
    try:
        return parse_version(importlib.metadata.version("triton"))
    except importlib.metadata.PackageNotFoundError:  # a source tree on the path: trust it
        return MIN_TRITON


def triton_problem() -> str | None:
    """Why the kernels cannot run with the triton here, or None when they can."""
    version = triton_version()
    if version is None:
        return "triton is not installed (Triton publishes wheels for Linux only)"
    if version < MIN_TRITON:
        return (f"triton {version[0]}.{version[1]} is installed and the kernels need triton >= "
                f"{MIN_TRITON[0]}.{MIN_TRITON[1]} (torch >= 2.7 ships it)")
    return None


def interpreting() -> bool:
    """Whether triton runs kernels in its CPU interpreter: TRITON_INTERPRET as the installed
    triton reads it (triton.knobs from 3.4 on: 1, true, on or yes; before: 1)."""
    knobs = getattr(sys.modules.get("triton"), "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET") == "1"
