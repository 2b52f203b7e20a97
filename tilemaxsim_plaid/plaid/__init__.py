"""The colbert-ai integration: patch targets, enable/disable, the device-resident PLAID scorer.

``import tilemaxsim_plaid`` calls :func:`auto_enable`, which patches colbert-ai at once if it is
imported already and otherwise when it is imported (an import hook); :func:`disable` restores
colbert-ai exactly, :func:`enabled` patches for a ``with`` block, :func:`stats` says what the
plugin did. Importing this package imports neither colbert-ai nor torch; patching does.
"""

from tilemaxsim_plaid.plaid.counters import PluginStats, stats
from tilemaxsim_plaid.plaid.registry import (
    DISABLE_ENV_VAR,
    auto_enable,
    disable,
    enable,
    enabled,
    is_enabled,
    is_pending,
)

__all__ = ["enable", "disable", "enabled", "is_enabled", "is_pending", "auto_enable", "stats",
           "PluginStats", "DISABLE_ENV_VAR"]
