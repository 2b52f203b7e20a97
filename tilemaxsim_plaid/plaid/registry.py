"""One patch mechanism, and the libraries whose bindings it changes.

A :class:`~tilemaxsim_plaid.plaid.patch_target.PatchTarget` names an attribute of a module or
class (``owner``), the replacement for it, and every other module that copied the name by value
with ``from owner import name`` (patching only the owner would leave those copies pointing at
the original). :func:`enable` swaps each binding and remembers what was there; :func:`disable`
puts back exactly that, deleting attributes that did not exist before. Both are idempotent and
act per library and per target group:

* ``"compat"``: what colbert-ai needs to run at all here: torch equivalents of its six
  JIT-compiled C++/CUDA extensions (no compiler, no nvcc) and the transformers-5 fix. These
  keep upstream semantics, so a "stock" run with only this group is still stock colbert-ai.
* ``"scoring"``: PLAID's candidate scoring (stages 2-4) and reranking on our kernels, and the
  scoring functions of the libraries built on ColBERT models.

The libraries (:data:`LIBRARIES`): colbert-ai and RAGatouille make up the plugin (what
``import tilemaxsim_plaid`` and :func:`enable` patch); PyLate is patched only on request
(:func:`tilemaxsim_plaid.pylate.patch_pylate`). A library's targets are resolved once its
``module`` has been imported completely: :func:`enable` imports it where that is cheap, and
otherwise an import hook patches it as the user's import finishes (RAGatouille's package
imports LangChain and LlamaIndex, which the plugin must not pull in).

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
    "Library",
    "LIBRARIES",
    "PLUGIN_LIBRARIES",
    "SUPPORTED_COLBERT_VERSIONS",
    "SUPPORTED_PYLATE_VERSIONS",
    "SUPPORTED_RAGATOUILLE_VERSIONS",
    "GROUPS",
    "DISABLE_ENV_VAR",
    "enable",
    "disable",
    "enabled",
    "is_enabled",
    "is_pending",
    "auto_enable",
    "colbert_version",
    "installed_version",
    "active_bindings",
]

logger = logging.getLogger(__name__)

# The targets read private structure of these releases (IndexScorer fields, the extension
# flags, class_factory; RAGatouille's ColBERT._colbert_score; PyLate's scoring module and the
# modules that import it); another version may have moved them, so it is refused, not guessed.
SUPPORTED_COLBERT_VERSIONS = ("0.2.22",)
SUPPORTED_RAGATOUILLE_VERSIONS = ("0.0.9",)
SUPPORTED_PYLATE_VERSIONS = ("1.6.0",)
# The package whose import applies colbert-ai's pending patch (its __init__ imports every owner).
COLBERT_PACKAGE = "colbert"


@dataclasses.dataclass(frozen=True)
class Library:
    """A package whose bindings the registry patches.

    Attributes:
        distribution: its name on PyPI, for the installed version.
        module: the module whose complete import defines every owner of its targets.
        targets: the name of its tuple of targets in :mod:`tilemaxsim_plaid.plaid.targets`.
        versions: the releases its targets were read from; another is refused with a warning.
        version: ``"module:function"`` returning the installed version (None when missing),
            looked up at each check.
        imported_by_enable: whether :func:`enable` imports ``module``; if not, the targets wait
            for the user's import (an import hook) when it has not happened yet.
    """

    distribution: str
    module: str
    targets: str
    versions: tuple[str, ...]
    version: str
    imported_by_enable: bool

    @property
    def package(self) -> str:
        return self.module.partition(".")[0]


LIBRARIES = {
    "colbert-ai": Library("colbert-ai", COLBERT_PACKAGE, "TARGETS", SUPPORTED_COLBERT_VERSIONS,
                          f"{__name__}:colbert_version", imported_by_enable=True),
    "ragatouille": Library("ragatouille", "ragatouille.models.colbert", "RAGATOUILLE_TARGETS",
                           SUPPORTED_RAGATOUILLE_VERSIONS,
                           "tilemaxsim_plaid.ragatouille:ragatouille_version",
                           imported_by_enable=False),
    "pylate": Library("pylate", "pylate.scores.colbert", "PYLATE_TARGETS",
                      SUPPORTED_PYLATE_VERSIONS, "tilemaxsim_plaid.pylate:pylate_version",
                      imported_by_enable=True),
}
# What `import tilemaxsim_plaid`, enable() and disable() patch by default.
PLUGIN_LIBRARIES = ("colbert-ai", "ragatouille")

# Marks an attribute that did not exist before enable(): disable() deletes it again.
_ABSENT = object()


@dataclasses.dataclass
class _Applied:
    replacement: Any
    # (namespace object, value before enable or _ABSENT) for the owner first, then each copy.
    previous: list[tuple[Any, Any]]

    @property
    def original(self) -> Any:
        return self.previous[0][1]


_lock = threading.RLock()
_applied: dict[str, _Applied] = {}
# Per library: the groups waiting for its module to be imported (see auto_enable).
_pending: dict[str, set[str]] = {}


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


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def colbert_version() -> str | None:
    """Installed colbert-ai version, or None when it is not installed."""
    return installed_version("colbert-ai")


def _version_guard(library: Library) -> bool:
    version = _resolve(library.version)()
    name = library.distribution
    if version is None:
        logger.info("%s is not installed: nothing to patch", name)
        return False
    if version not in library.versions:
        warnings.warn(
            f"tilemaxsim_plaid supports {name} {', '.join(library.versions)}, "
            f"found {name} {version}: leaving {name} unpatched",
            RuntimeWarning,
            stacklevel=4,
        )
        return False
    return True


@functools.cache
def _targets_of(library: str) -> tuple[PatchTarget, ...]:
    from tilemaxsim_plaid.plaid import targets

    return getattr(targets, LIBRARIES[library].targets)


def _groups(groups: Iterable[str] | None) -> tuple[str, ...]:
    chosen = GROUPS if groups is None else tuple(groups)
    unknown = set(chosen) - set(GROUPS)
    if unknown:
        raise ValueError(f"groups must be drawn from {GROUPS}, got {sorted(unknown)}")
    return chosen


def _libraries(libraries: Iterable[str] | None) -> tuple[str, ...]:
    if isinstance(libraries, str):
        raise TypeError(f"libraries must be a sequence of names from {tuple(LIBRARIES)}, "
                        f"got the string {libraries!r}")
    chosen = PLUGIN_LIBRARIES if libraries is None else tuple(libraries)
    unknown = set(chosen) - set(LIBRARIES)
    if unknown:
        raise ValueError(f"libraries must be drawn from {tuple(LIBRARIES)}, got {sorted(unknown)}")
    return chosen


def _select(groups: Iterable[str] | None,
            libraries: Iterable[str] | None = None) -> list[PatchTarget]:
    chosen = _groups(groups)
    return [t for library in _libraries(libraries) for t in _targets_of(library)
            if t.group in chosen]


def _apply(target: PatchTarget) -> None:
    owner = _resolve(target.owner)
    original = _raw(owner, target.attribute)
    replacement = target.make_replacement(None if original is _ABSENT else original)
    previous = [(owner, original)]
    for module_name in target.also_bound_in:
        module = importlib.import_module(module_name)
        previous.append((module, _raw(module, target.attribute)))
    for module_name in getattr(target, "bound_if_imported", ()):
        module = sys.modules.get(module_name)
        if module is not None:
            previous.append((module, _raw(module, target.attribute)))
    for namespace, _ in previous:
        setattr(namespace, target.attribute, replacement)
    _applied[target.name] = _Applied(replacement, previous)


def _restore_default(module_name: str, qualname: str, parameter: str, replacement, original):
    """A function's default argument captured while patched gets the original back."""
    function = sys.modules.get(module_name)
    if function is None:
        return
    for part in qualname.split("."):
        function = getattr(function, part, None)
    code = getattr(function, "__code__", None)
    if code is None or not function.__defaults__:
        return
    positional = code.co_varnames[:code.co_argcount]
    first_default = code.co_argcount - len(function.__defaults__)
    if parameter in positional and positional.index(parameter) >= first_default:
        index = positional.index(parameter) - first_default
        if function.__defaults__[index] is replacement:
            defaults = list(function.__defaults__)
            defaults[index] = original
            function.__defaults__ = tuple(defaults)


def _revert(target: PatchTarget) -> None:
    applied = _applied.pop(target.name)
    original = applied.original
    recorded = {id(namespace) for namespace, _ in applied.previous}
    # A module imported while patched bound the replacement from the owner's package: it gets
    # the original, which is what it would hold had the patch not been there.
    for module_name in getattr(target, "bound_if_imported", ()):
        module = sys.modules.get(module_name)
        if (module is not None and id(module) not in recorded
                and _raw(module, target.attribute) is applied.replacement):
            _put(module, target.attribute, original)
    if original is not _ABSENT:
        for module_name, qualname, parameter in getattr(target, "default_of", ()):
            _restore_default(module_name, qualname, parameter, applied.replacement, original)
    # Reverse order: when the owner is also listed as a copy, its first value wins.
    for namespace, value in reversed(applied.previous):
        _put(namespace, target.attribute, value)


def _apply_pending(library: str, module) -> None:
    """The import hook's callback: ``library``'s module has just been imported."""
    with _lock:
        groups = sorted(_pending.pop(library, ()))
    if not groups:
        return
    try:
        enable(groups, libraries=(library,))
    except Exception as error:  # noqa: BLE001 (the user's import must still work)
        name = LIBRARIES[library].distribution
        warnings.warn(f"tilemaxsim_plaid could not patch {name} as it was imported "
                      f"({type(error).__name__}: {error}): {name} left unpatched",
                      RuntimeWarning, stacklevel=2)


def _wait_for_import(library: str, groups: Iterable[str]) -> None:
    with _lock:
        _pending.setdefault(library, set()).update(groups)
        module = LIBRARIES[library].module
        if not import_hook.is_pending(module):
            import_hook.call_after_import(module, functools.partial(_apply_pending, library))


def _imported(library: Library) -> bool:
    """Whether the library's module is imported completely (its hook has run, if any)."""
    return library.module in sys.modules and not import_hook.is_pending(library.module)


def _installed(library: Library) -> bool:
    return importlib.util.find_spec(library.package) is not None


def _enable_library(name: str, groups: tuple[str, ...]) -> bool | None:
    """True: patched; False: missing or refused; None: waiting for the user's import."""
    library = LIBRARIES[name]
    if not library.imported_by_enable and not _imported(library):
        if not _installed(library):
            return False
        _wait_for_import(name, groups)
        return None
    if not _version_guard(library):
        return False
    if import_hook.is_pending(library.module):
        # Importing it runs the hook, which applies the groups waiting for it first.
        importlib.import_module(library.module)
    targets = [t for t in _targets_of(name) if t.group in groups]
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
    logger.debug("tilemaxsim_plaid patched %d %s bindings", len(done), library.distribution)
    return True


def enable(groups: Iterable[str] | None = None, libraries: Iterable[str] | None = None) -> bool:
    """Patch the libraries so they score with tilemaxsim_plaid's kernels.

    Safe to call repeatedly: targets already patched are left as they are. colbert-ai and PyLate
    are imported; RAGatouille, if installed but not imported yet, is patched as its import
    finishes (its package imports LangChain).

    Args:
        groups: target groups to patch (default: all of :data:`GROUPS`).
        libraries: names from :data:`LIBRARIES` (default: :data:`PLUGIN_LIBRARIES`).

    Returns:
        True when the libraries that enable() imports (colbert-ai, PyLate) are patched, or, for
        RAGatouille alone, when it is patched now. False when one of them is missing or its
        version is unsupported (a RuntimeWarning names it); that library is left unchanged.
    """
    chosen, names = _groups(groups), _libraries(libraries)
    results = {name: _enable_library(name, chosen) for name in names}
    imported = [results[name] for name in names if LIBRARIES[name].imported_by_enable]
    return all(imported) if imported else all(r is True for r in results.values())


def disable(groups: Iterable[str] | None = None, libraries: Iterable[str] | None = None) -> None:
    """Restore the libraries exactly as they were before :func:`enable` (idempotent).

    Groups still waiting for a library to be imported (:func:`auto_enable`) are dropped too,
    so a later import stays stock.

    Args:
        groups: target groups to restore (default: all).
        libraries: names from :data:`LIBRARIES` (default: :data:`PLUGIN_LIBRARIES`).
    """
    chosen, names = _groups(groups), _libraries(libraries)
    with _lock:
        for name in names:
            waiting = _pending.get(name, set())
            waiting.difference_update(chosen)
            if not waiting:
                _pending.pop(name, None)
                import_hook.cancel(LIBRARIES[name].module)
        if not _applied:
            return
        for target in reversed(_select(chosen, names)):
            if target.name in _applied:
                _revert(target)


def is_enabled(groups: Iterable[str] | None = ("scoring",),
               libraries: Iterable[str] | None = ("colbert-ai",)) -> bool:
    """True when every target of ``groups`` (default: the scoring group) of ``libraries``
    (default: colbert-ai) is patched now.

    False while the patch still waits for the library to be imported (see :func:`is_pending`).
    """
    chosen, names = _groups(groups), _libraries(libraries)
    with _lock:
        if not _applied:
            return False
        targets = _select(chosen, names)
        return bool(targets) and all(t.name in _applied for t in targets)


def is_pending(libraries: Iterable[str] | None = ("colbert-ai",)) -> bool:
    """True when a patch of ``libraries`` (default: colbert-ai) waits for its import."""
    names = _libraries(libraries)
    with _lock:
        return any(_pending.get(name) and import_hook.is_pending(LIBRARIES[name].module)
                   for name in names)


@contextlib.contextmanager
def enabled(groups: Iterable[str] | None = None,
            libraries: Iterable[str] | None = None) -> Iterator[bool]:
    """Patch for the duration of a ``with`` block, then restore only what the block patched.

    Yields:
        Whether the targets are patched inside the block (see :func:`enable`).
    """
    chosen, names = _groups(groups), _libraries(libraries)
    for name in names:
        library = LIBRARIES[name]
        if library.imported_by_enable and import_hook.is_pending(library.module):
            importlib.import_module(library.module)  # apply what waits, so it is kept after
    with _lock:
        before = set(_applied)
        waiting = {name: set(_pending.get(name, ())) for name in names}
    ok = enable(chosen, names)
    try:
        yield ok
    finally:
        with _lock:
            for target in reversed(_select(chosen, names)):
                if target.name in _applied and target.name not in before:
                    _revert(target)
            for name in names:
                if _pending.get(name, set()) != waiting[name]:
                    _pending[name] = waiting[name]
                    if not waiting[name]:
                        _pending.pop(name)
                        import_hook.cancel(LIBRARIES[name].module)


def enabled_groups() -> set[str]:
    """The groups with at least one plugin binding patched now (to put a state back later)."""
    with _lock:
        if not _applied:
            return set()
        return {t.group for t in _select(None) if t.name in _applied}


def active_bindings(libraries: Iterable[str] | None = tuple(LIBRARIES)) -> dict[str, Any]:
    """``{"owner.attribute": replacement}`` for every binding of ``libraries`` (default: all)
    patched now (for tests, logs)."""
    names = {t.name for t in _select(None, libraries)} if _applied else set()
    with _lock:
        return {name: applied.replacement for name, applied in _applied.items() if name in names}


def auto_enable() -> bool:
    """What ``import tilemaxsim_plaid`` calls: patch the plugin unless the environment says no.

    A library imported already is patched at once. Otherwise nothing is imported: an import
    hook (:mod:`tilemaxsim_plaid.plaid.import_hook`) patches it as soon as its module has
    finished importing, before any user code can hold its functions. colbert-ai reads the
    visible GPUs when it is imported, so set ``CUDA_VISIBLE_DEVICES`` before that.

    Returns:
        True when colbert-ai was patched now; False when the patch waits for colbert-ai's
        import (:func:`is_pending`), colbert-ai is missing, or ``TILEMAXSIM_PLAID_DISABLE`` is set.
    """
    if environment.plugin_disabled():
        logger.info("%s is set: colbert-ai left unpatched", DISABLE_ENV_VAR)
        return False
    patched = False
    for name in PLUGIN_LIBRARIES:
        library = LIBRARIES[name]
        if library.module in sys.modules:
            ok = enable(libraries=(name,))
            patched = patched or (ok and name == "colbert-ai")
        elif _installed(library):
            _wait_for_import(name, GROUPS)
    return patched
