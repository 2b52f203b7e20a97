"""The colbert-ai integration: patch targets, enable/disable, the device-resident PLAID scorer.

``import tilemaxsim_plaid`` calls :func:`auto_enable`; :func:`disable` restores colbert-ai
exactly, :func:`enabled` patches for a ``with`` block. Importing this package does not import
colbert-ai; patching does.
"""

from tilemaxsim_plaid.plaid.registry import (
    DISABLE_ENV_VAR,
    auto_enable,
    disable,
    enable,
    enabled,
    is_enabled,
)

__all__ = ["enable", "disable", "enabled", "is_enabled", "auto_enable", "DISABLE_ENV_VAR"]
