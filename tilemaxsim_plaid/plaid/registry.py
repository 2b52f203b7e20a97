"""One patch mechanism and the list of colbert-ai bindings it changes.

A :class:`~tilemaxsim_plaid.plaid.patch_target.PatchTarget` names an attribute of a module or
class (``owner``), the replacement for it, and every other module that copied the name by value
with ``from owner import name`` (patching only the owner would leave those copies pointing at
the original). :func:`enable` swaps each binding and remembers what was there; :func:`disable`
puts back exactly that, deleting attributes that did not exist before. Both are idempotent and
act per target group:

* ``"compat"``: what colbert-ai needs to run at all here: torch equivalents of its six
  JIT-compiled C++/CUDA extensions (no compiler, no nvcc) and the transformers-5 fix. These
  keep upstream semantics, so a "stock" run with only this group is still stock colbert-ai.
* ``"scoring"``: PLAID's candidate scoring (stages 2-4) and reranking on our kernels.

The targets themselves are listed in :mod:`tilemaxsim_plaid.plaid.targets`, which this module
imports only when it patches: the targets import the scoring code (torch, the kernels), and
``import tilemaxsim_plaid`` must stay cheap. Module graph: ``patch_target`` <- ``targets`` <-
``registry`` (at first patch); ``registry`` -> ``environment``, ``import_hook``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from tilemaxsim_plaid.plaid import environment, import_hook
from tilemaxsim_plaid.plaid.environment import DISABLE_ENV_VAR
from tilemaxsim_plaid.plaid.patch_target import GROUPS, PatchTarget

__all__ = [
    "PatchTarget",
    "SUPPORTED_COLBERT_VERSIONS",
    "GROUPS",
    "DISABLE_ENV_VAR",
    "enable",
    "disable",
    "enabled",
    "is_enabled",
    "is_pending",
    "auto_enable",
    "colbert_version",
    "active_bindings",
]

logger = logging.getLogger(__name__)

# The targets read private structure of these releases (IndexScorer fields, the extension
# flags, class_factory); another version may have moved them, so it is refused, not guessed.
SUPPORTED_COLBERT_VERSIONS = ("0.2.22",)
# The package whose import applies the pending patch (its __init__ imports every owner module).
COLBERT_PACKAGE = "colbert"

# Marks an attribute that did not exist before enable(): disable() deletes it again.
_ABSENT = object()


@dataclasses.dataclass
class _Applied:
    replacement: Any
    # (namespace object, value before enable or _ABSENT) for the owner and each copy.
    previous: list[tuple[Any, Any]]


_lock = threading.RLock()
_applied: dict[str, _Applied] = {}


def _resolve(owner: str) -> Any:
    module_name, _, class_name = owner.partition(":")
    obj = importlib.import_module(module_name)
    return getattr(obj, class_name) if class_name else obj


def _raw(namespace: Any, attribute: str) -> Any:
    # vars(), not getattr(): a classmethod/staticmethod must be restored as the descriptor
    # itself, and an inherited attribute must not be copied onto the subclass.
    return vars(namespace).get(attribute, _ABSENT)


def _put(namespace: Any, attribute: str, value: Any) -> None:
    if value is _ABSENT:
        if attribute in vars(namespace):
            delattr(namespace, attribute)
    else:
        setattr(namespace, attribute, value)


def colbert_version() -> str | None:
    """Installed colbert-ai version, or None when it is not installed."""
    try:
        return importlib.metadata.version("colbert-ai")
    except importlib.metadata.PackageNotFoundError:
        return None


def _version_guard() -> bool:
    version = colbert_version()
    if version is None:
        logger.info("colbert-ai is not installed: nothing to patch")
        return False
    if version not in SUPPORTED_COLBERT_VERSIONS:
        warnings.warn(
            f"tilemaxsim_plaid supports colbert-ai {', '.join(SUPPORTED_COLBERT_VERSIONS)}, "
            f"found colbert-ai {version}: leaving colbert-ai unpatched",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


@functools.cache
def _all_targets() -> tuple[PatchTarget, ...]:
    from tilemaxsim_plaid.plaid.targets import TARGETS

    return TARGETS


def _groups(groups: Iterable[str] | None) -> tuple[str, ...]:
    chosen = GROUPS if groups is None else tuple(groups)
    unknown = set(chosen) - set(GROUPS)
    if unknown:
        raise ValueError(f"groups must be drawn from {GROUPS}, got {sorted(unknown)}")
    return chosen


def _select(groups: Iterable[str] | None) -> list[PatchTarget]:
    chosen = _groups(groups)
    return [t for t in _all_targets() if t.group in chosen]


def _apply(target: PatchTarget) -> None:
    owner = _resolve(target.owner)
    original = _raw(owner, target.attribute)
    replacement = target.make_replacement(None if original is _ABSENT else original)
    previous = [(owner, original)]
    for module_name in target.also_bound_in:
        module = importlib.import_module(module_name)
        previous.append((module, _raw(module, target.attribute)))
    for namespace, _ in previous:
        setattr(namespace, target.attribute, replacement)
    _applied[target.name] = _Applied(replacement, previous)


def _revert(target: PatchTarget) -> None:
    applied = _applied.pop(target.name)
    # Reverse order: when the owner is also listed as a copy, its first value wins.
    for namespace, value in reversed(applied.previous):
        _put(namespace, target.attribute, value)


# Groups that `import tilemaxsim_plaid` will patch when colbert-ai is imported (see auto_enable).
_pending: set[str] = set()


def _apply_pending(module) -> None:
    """The import hook's callback: colbert-ai has just been imported."""
    with _lock:
        groups = sorted(_pending)
        _pending.clear()
    if not groups:
        return
    try:
        enable(groups)
    except Exception as error:  # noqa: BLE001 (the user's `import colbert` must still work)
        warnings.warn(f"tilemaxsim_plaid could not patch colbert-ai as it was imported "
                      f"({type(error).__name__}: {error}): colbert-ai left unpatched",
                      RuntimeWarning, stacklevel=2)


def _settle_pending() -> None:
    """Import colbert-ai if a patch waits for it, so that the pending groups are applied first."""
    if import_hook.is_pending(COLBERT_PACKAGE):
        importlib.import_module(COLBERT_PACKAGE)


def enable(groups: Iterable[str] | None = None) -> bool:
    """Patch colbert-ai so PLAID scores with tilemaxsim_plaid's kernels (imports colbert-ai).

    Safe to call repeatedly: targets already patched are left as they are.

    Args:
        groups: target groups to patch (default: all of :data:`GROUPS`).

    Returns:
        True when the targets are patched; False when colbert-ai is missing or its version
        is unsupported (a RuntimeWarning names it), in which case nothing changed.
    """
    chosen = _groups(groups)
    if not _version_guard():
        return False
    _settle_pending()
    targets = _select(chosen)
    with _lock:
        done = []
        try:
            for target in targets:
                if target.name not in _applied:
                    _apply(target)
                    done.append(target)
        except BaseException:
            for target in reversed(done):
                _revert(target)
            raise
    logger.debug("tilemaxsim_plaid patched %d colbert-ai bindings", len(_applied))
    return True


def disable(groups: Iterable[str] | None = None) -> None:
    """Restore colbert-ai exactly as it was before :func:`enable` (idempotent).

    Groups still waiting for colbert-ai to be imported (:func:`auto_enable`) are dropped too,
    so a later ``import colbert`` stays stock.

    Args:
        groups: target groups to restore (default: all).
    """
    chosen = _groups(groups)
    with _lock:
        _pending.difference_update(chosen)
        if not _pending:
            import_hook.cancel(COLBERT_PACKAGE)
        if not _applied:
            return
        for target in reversed(_select(chosen)):
            if target.name in _applied:
                _revert(target)


def is_enabled(groups: Iterable[str] | None = ("scoring",)) -> bool:
    """True when every target of ``groups`` (default: the scoring group) is patched now.

    False while the patch still waits for colbert-ai to be imported (see :func:`is_pending`).
    """
    chosen = _groups(groups)
    with _lock:
        if not _applied:
            return False
        targets = _select(chosen)
        return bool(targets) and all(t.name in _applied for t in targets)


def is_pending() -> bool:
    """True when ``import tilemaxsim_plaid`` left a patch to apply when colbert-ai is imported."""
    with _lock:
        return bool(_pending) and import_hook.is_pending(COLBERT_PACKAGE)


@contextlib.contextmanager
def enabled(groups: Iterable[str] | None = None) -> Iterator[bool]:
    """Patch for the duration of a ``with`` block, then restore only what the block patched.

    Yields:
        Whether the targets are patched inside the block (see :func:`enable`).
    """
    chosen = _groups(groups)
    _settle_pending()
    targets = _select(chosen)
    with _lock:
        before = {t.name for t in targets if t.name in _applied}
    ok = enable(chosen)
    try:
        yield ok
    finally:
        with _lock:
            for target in reversed(targets):
                if target.name in _applied and target.name not in before:
                    _revert(target)


def enabled_groups() -> set[str]:
    """The groups with at least one binding patched now (to put a state back after changing it)."""
    with _lock:
        if not _applied:
            return set()
        return {t.group for t in _select(None) if t.name in _applied}


def active_bindings() -> dict[str, Any]:
    """``{"owner.attribute": replacement}`` for every binding patched now (for tests, logs)."""
    with _lock:
        return {name: applied.replacement for name, applied in _applied.items()}


def auto_enable() -> bool:
    """What ``import tilemaxsim_plaid`` calls: patch everything unless the environment says no.

    If colbert-ai is imported already, it is patched at once. Otherwise nothing is imported:
    an import hook (:mod:`tilemaxsim_plaid.plaid.import_hook`) patches colbert-ai as soon as
    its package has finished importing, before any user code can hold its functions. colbert-ai
    reads the visible GPUs when it is imported, so set ``CUDA_VISIBLE_DEVICES`` before that.

    Returns:
        True when colbert-ai was patched now; False when the patch waits for colbert-ai's
        import (:func:`is_pending`), colbert-ai is missing, or ``TILEMAXSIM_PLAID_DISABLE`` is set.
    """
    if environment.plugin_disabled():
        logger.info("%s is set: colbert-ai left unpatched", DISABLE_ENV_VAR)
        return False
    if COLBERT_PACKAGE in sys.modules:
        return enable()
    if importlib.util.find_spec(COLBERT_PACKAGE) is None:
        return False
    with _lock:
        _pending.update(GROUPS)
    import_hook.call_after_import(COLBERT_PACKAGE, _apply_pending)
    return False
