"""What ``import tilemaxsim_plaid`` does, each case in a fresh interpreter.

The import is cheap (no colbert-ai, transformers, faiss or triton) and the one-import contract
holds in both orders: colbert-ai imported first is patched at once, colbert-ai imported later
is patched by the import hook before the import statement returns. ``TILEMAXSIM_PLAID_DISABLE``
opts out in both orders. The ``plaid`` modules form no import circle.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pathlib
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import tilemaxsim_plaid

PACKAGE_DIR = pathlib.Path(tilemaxsim_plaid.__file__).parent
REPO_ROOT = PACKAGE_DIR.parent
HEAVY = ("colbert", "transformers", "faiss", "triton")
# `import tilemaxsim_plaid` after `import torch` must add at most this. The target is 0.5 s;
# the bound is loose so that a busy 2-core CI machine does not fail it.
IMPORT_SECONDS_OVER_TORCH = 1.5

needs_colbert = pytest.mark.skipif(importlib.util.find_spec("colbert") is None,
                                   reason="colbert-ai is not installed (pip install .[colbert])")


def run_fresh(*pieces: str, **env: str) -> dict:
    """Run the code ``pieces`` (each dedented) in a new interpreter, without any inherited
    TILEMAXSIM_PLAID_* variable but ``env``; the code prints one JSON object last."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TILEMAXSIM_PLAID_")}
    environment.update(env)
    code = "\n".join(textwrap.dedent(piece) for piece in pieces)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                            env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# Reads what the patch did, in the child: each binding against the registry's replacement.
_CHECK_PATCHED = """
import json, sys
import colbert.modeling.colbert as modeling_colbert
import colbert.search.index_storage as index_storage
from colbert.search.index_storage import IndexScorer
from tilemaxsim_plaid.plaid import registry

def patched():
    active = registry.active_bindings()
    packed = active.get("colbert.modeling.colbert.colbert_score_packed")
    rank = active.get("colbert.search.index_storage:IndexScorer.rank")
    return dict(
        count=len(active),
        packed=packed is not None and modeling_colbert.colbert_score_packed is packed
               and index_storage.colbert_score_packed is packed,
        rank=rank is not None and vars(IndexScorer)["rank"] is rank,
        wrapped=hasattr(index_storage.colbert_score_packed, "__wrapped__")
                or hasattr(vars(IndexScorer)["rank"], "__wrapped__"),
        enabled=registry.is_enabled(["compat", "scoring"]),
    )
"""


def test_import_is_light_and_fast():
    info = run_fresh("""
        import json, sys, time
        start = time.perf_counter()
        import torch
        after_torch = time.perf_counter()
        import tilemaxsim_plaid
        done = time.perf_counter()
        names = list(tilemaxsim_plaid.__all__)
        print(json.dumps(dict(torch=after_torch - start, plugin=done - after_torch,
                              heavy=[m for m in sys.modules if m.split(".")[0] in
                                     ("colbert", "transformers", "faiss", "triton")],
                              names=names)))
    """)
    assert info["heavy"] == [], info["heavy"]
    assert info["plugin"] < IMPORT_SECONDS_OVER_TORCH, info
    assert set(info["names"]) >= {"enable", "disable", "stats", "maxsim_packed", "PQCodec"}


def test_every_public_name_resolves():
    info = run_fresh("""
        import json, tilemaxsim_plaid
        missing = [n for n in tilemaxsim_plaid.__all__ if getattr(tilemaxsim_plaid, n, None) is None]
        print(json.dumps(dict(missing=missing, listed=sorted(set(tilemaxsim_plaid.__all__) - set(dir(tilemaxsim_plaid))))))
    """, TILEMAXSIM_PLAID_DISABLE="1")
    assert info == {"missing": [], "listed": []}


def _all_modules() -> list[str]:
    names = ["tilemaxsim_plaid"]
    for module in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="tilemaxsim_plaid."):
        if not module.name.endswith("__main__"):
            names.append(module.name)
    return names


@needs_colbert
def test_every_module_imports_first():
    """Each module imported as the first of the package (the others dropped from sys.modules
    in between), so that an import that works only in some order fails here."""
    info = run_fresh(f"""
        import importlib, json, sys, traceback
        failures = {{}}
        for name in {_all_modules()!r}:
            for loaded in [m for m in sys.modules if m.split(".")[0] == "tilemaxsim_plaid"]:
                del sys.modules[loaded]
            try:
                importlib.import_module(name)
            except Exception:
                failures[name] = traceback.format_exc(limit=-3)
        print(json.dumps(failures))
    """, TILEMAXSIM_PLAID_DISABLE="1")
    assert info == {}, "\n".join(info.values())


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name of ``from <node.module> import ...`` written in ``module``."""
    if not node.level:
        return node.module
    parts = module.split(".")
    package = parts if is_package else parts[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _plaid_import_graph() -> dict[str, set[str]]:
    """``{module: plaid modules it imports}`` over every import statement (function-level ones
    too: they are what held the old circles open), for the modules of tilemaxsim_plaid.plaid."""
    prefix = "tilemaxsim_plaid.plaid"
    modules = {f"{prefix}.{path.stem}": path for path in (PACKAGE_DIR / "plaid").glob("*.py")}
    modules[prefix] = modules.pop(f"{prefix}.__init__")
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_package=path.name == "__init__.py")
                # `from package import submodule` imports the submodule.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == "open":
                return stack[stack.index(successor):] + [successor]
            if successor not in state:
                found = visit(successor)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_plaid_modules_form_no_import_circle():
    graph = _plaid_import_graph()
    assert "tilemaxsim_plaid.plaid.targets" in graph["tilemaxsim_plaid.plaid.registry"]
    assert "tilemaxsim_plaid.plaid.backends" in graph["tilemaxsim_plaid.plaid.scoring"]
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@needs_colbert
def test_colbert_imported_first_is_patched_at_once():
    info = run_fresh("""
        import colbert
        import tilemaxsim_plaid
    """, _CHECK_PATCHED, """
        print(json.dumps(patched()))
    """)
    assert info["packed"] and info["rank"] and info["wrapped"] and info["enabled"], info


@needs_colbert
def test_colbert_imported_later_is_patched_by_the_hook():
    info = run_fresh("""
        import json, sys
        import tilemaxsim_plaid
        from tilemaxsim_plaid.plaid import registry
        before = dict(colbert="colbert" in sys.modules, pending=registry.is_pending(),
                      enabled=registry.is_enabled())
        # A submodule first: its parent package runs the hook before this name is bound.
        from colbert.modeling.colbert import colbert_score_packed
        bound_patched = colbert_score_packed is registry.active_bindings().get(
            "colbert.modeling.colbert.colbert_score_packed")
        import colbert
        loader = type(colbert.__loader__).__name__ + "/" + type(colbert.__spec__.loader).__name__
    """, _CHECK_PATCHED, """
        after = patched()
        tilemaxsim_plaid.disable()
        tilemaxsim_plaid.disable()
        off = patched()
        restored = index_storage.colbert_score_packed is colbert_score_packed.__wrapped__
        tilemaxsim_plaid.enable()
        tilemaxsim_plaid.enable()
        again = patched()
        print(json.dumps(dict(before=before, bound_patched=bound_patched, loader=loader,
                              after=after, off=off, restored=restored, again=again,
                              pending=registry.is_pending())))
    """)
    assert info["before"] == {"colbert": False, "pending": True, "enabled": False}
    assert info["bound_patched"]
    assert info["loader"] == "SourceFileLoader/SourceFileLoader"
    assert info["after"]["packed"] and info["after"]["rank"] and info["after"]["enabled"]
    assert info["off"] == {"count": 0, "packed": False, "rank": False, "wrapped": False, "enabled": False}
    assert info["restored"]
    assert info["again"] == info["after"] and not info["pending"]


@needs_colbert
@pytest.mark.parametrize("colbert_first", [True, False], ids=["colbert-first", "colbert-later"])
def test_disable_variable_opts_out_in_both_orders(colbert_first):
    first, second = ("import colbert", "import tilemaxsim_plaid") if colbert_first else \
        ("import tilemaxsim_plaid", "import colbert")
    info = run_fresh(f"""
        {first}
        {second}
        from tilemaxsim_plaid.plaid import import_hook, registry
    """, _CHECK_PATCHED, """
        print(json.dumps(dict(patched(), hook=import_hook.is_pending("colbert"))))
    """, TILEMAXSIM_PLAID_DISABLE="1")
    assert info == {"count": 0, "packed": False, "rank": False, "wrapped": False,
                    "enabled": False, "hook": False}


@needs_colbert
def test_disable_before_colbert_is_imported_keeps_it_stock():
    info = run_fresh("""
        import tilemaxsim_plaid
        tilemaxsim_plaid.disable()
        import colbert
    """, _CHECK_PATCHED, """
        print(json.dumps(patched()))
    """)
    assert info == {"count": 0, "packed": False, "rank": False, "wrapped": False, "enabled": False}


def test_bad_disable_value_is_named():
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TILEMAXSIM_PLAID_")}
    environment["TILEMAXSIM_PLAID_DISABLE"] = "maybe"
    result = subprocess.run([sys.executable, "-c", "import tilemaxsim_plaid"], cwd=REPO_ROOT,
                            env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "ValueError: TILEMAXSIM_PLAID_DISABLE must be one of" in result.stderr, result.stderr
