"""What one colbert-ai binding the plugin changes looks like: :class:`PatchTarget`.

The lowest piece of the patch mechanism: :mod:`tilemaxsim_plaid.plaid.targets` lists the
targets, :mod:`tilemaxsim_plaid.plaid.registry` applies and reverts them; both import this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["GROUPS", "PatchTarget"]

# "compat": what colbert-ai needs to run at all here (upstream semantics kept);
# "scoring": PLAID's candidate scoring and reranking on the plugin's kernels.
GROUPS = ("compat", "scoring")


@dataclasses.dataclass(frozen=True)
class PatchTarget:
    """One attribute to replace.

    Attributes:
        owner: ``"package.module"`` or ``"package.module:Class"``: where the name is defined.
        attribute: the attribute name on the owner.
        make_replacement: called once with the original value (or None when absent); returns
            the replacement. Functions get ``__wrapped__`` = original.
        group: one of :data:`GROUPS`.
        also_bound_in: modules that did ``from <owner module> import <attribute>``.
        why: one line for patches/README.md and for error messages.
    """

    owner: str
    attribute: str
    make_replacement: Callable[[Any], Any]
    group: str
    also_bound_in: tuple[str, ...] = ()
    why: str = ""

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.attribute}"
