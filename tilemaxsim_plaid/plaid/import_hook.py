"""Run a function when a module finishes importing: a ``sys.meta_path`` finder.

``import tilemaxsim_plaid`` must patch colbert-ai whichever of the two is imported first,
without importing colbert-ai (and with it transformers and faiss) itself. When colbert-ai is
not imported yet, :func:`call_after_import` puts a finder first on ``sys.meta_path``; when
``colbert`` is imported (directly, or as the parent of any ``colbert.*`` module), the finder
hands the import to the finders after it and wraps the loader it gets, so that the callback
runs right after the package's ``__init__`` (which imports every module the patch targets)
and before the import statement returns to user code. The module keeps its own loader; the
finder removes itself once the callback ran.

A submodule can be waited for too (RAGatouille's ``ragatouille.models.colbert``, whose
package ``__init__`` imports LangChain): the callback runs when that module itself has been
executed, whichever import brought it in.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable

__all__ = ["call_after_import", "cancel", "is_pending"]

_lock = threading.Lock()


class _Loader(importlib.abc.Loader):
    """``loader`` with ``callback(module)`` after its ``exec_module``."""

    def __init__(self, loader, finder: "_PostImportFinder"):
        self._loader, self._finder = loader, finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # The module keeps the real loader (importlib.resources and pickling read it).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)  # an error leaves the finder in place for a retry
        self._finder.fire(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # a namespace package or a legacy loader: nothing to wrap
        spec.loader = _Loader(spec.loader, self)
        return spec

    def fire(self, module) -> None:
        with _lock:
            if self not in sys.meta_path:
                return  # cancelled meanwhile
            sys.meta_path.remove(self)
        self.callback(module)


def _finders(name: str) -> list[_PostImportFinder]:
    return [f for f in sys.meta_path if isinstance(f, _PostImportFinder) and f.name == name]


def call_after_import(name: str, callback: Callable) -> None:
    """Call ``callback(module)`` once, when module ``name`` has been imported.

    Replaces a callback already waiting for ``name``. The caller checks ``sys.modules`` first:
    a module imported already is not imported again, so the callback would never run.
    """
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"name must be a module name such as 'colbert', got {name!r}")
    with _lock:
        for finder in _finders(name):
            sys.meta_path.remove(finder)
        sys.meta_path.insert(0, _PostImportFinder(name, callback))


def cancel(name: str) -> None:
    """Forget the callback waiting for ``name``, if any."""
    with _lock:
        for finder in _finders(name):
            sys.meta_path.remove(finder)


def is_pending(name: str) -> bool:
    """Whether a callback waits for ``name`` to be imported."""
    with _lock:
        return bool(_finders(name))
