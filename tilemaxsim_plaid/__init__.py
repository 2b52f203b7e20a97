"""TileMaxSim-PLAID: IO-aware Triton MaxSim kernels and a one-import scorer for ColBERTv2/PLAID."""

from tilemaxsim_plaid.ops.dense import MaxSimConfig, maxsim_packed, maxsim_padded

__version__ = "0.1.0"

__all__ = ["MaxSimConfig", "maxsim_packed", "maxsim_padded", "__version__"]
