"""The patch registry: exact undo, idempotence, the version guard, the environment switch."""

from __future__ import annotations

import sys
import warnings

import pytest

pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")

import colbert.modeling.base_colbert as base_colbert  # noqa: E402
import colbert.modeling.colbert as modeling_colbert  # noqa: E402
import colbert.modeling.hf_colbert as hf_colbert  # noqa: E402
import colbert.search.index_storage as index_storage  # noqa: E402
from colbert.indexing.codecs.residual import ResidualCodec  # noqa: E402
from colbert.search.index_storage import IndexScorer  # noqa: E402
from colbert.searcher import Searcher  # noqa: E402

from tests.plaid.conftest import patch_state  # noqa: E402
from tilemaxsim_plaid.plaid import registry  # noqa: E402
from tilemaxsim_plaid.plaid.targets import TARGETS  # noqa: E402

pytestmark = pytest.mark.colbert

_ABSENT = object()


def _snapshot():
    """Every binding of every target, read raw (descriptors, not bound methods)."""
    values = {}
    for target in TARGETS:
        owner = registry._resolve(target.owner)
        values[(target.name, "owner")] = vars(owner).get(target.attribute, _ABSENT)
        for module_name in target.also_bound_in:
            module = registry._resolve(module_name)
            values[(target.name, module_name)] = vars(module).get(target.attribute, _ABSENT)
    return values


def test_disable_restores_every_binding_by_identity():
    with patch_state(()):
        before = _snapshot()
        original_packed = modeling_colbert.colbert_score_packed
        original_rank = vars(IndexScorer)["rank"]
        original_factory = hf_colbert.class_factory
        assert registry.enable()
        assert index_storage.colbert_score_packed is modeling_colbert.colbert_score_packed
        assert index_storage.colbert_score_packed is not original_packed
        assert index_storage.colbert_score_packed.__wrapped__ is original_packed
        assert IndexScorer.rank.__wrapped__ is original_rank
        assert base_colbert.class_factory.__wrapped__ is original_factory
        assert ResidualCodec.loaded_extensions is True
        registry.disable()
        assert _snapshot() == before
        assert index_storage.colbert_score_packed is original_packed
        assert vars(IndexScorer)["rank"] is original_rank
        assert base_colbert.class_factory is original_factory
        assert "decompress_residuals" not in vars(ResidualCodec) or before[
            ("colbert.indexing.codecs.residual:ResidualCodec.decompress_residuals", "owner")
        ] is not _ABSENT


def test_enable_and_disable_are_idempotent():
    with patch_state(()):
        assert registry.enable()
        assert registry.is_enabled(["compat", "scoring"])
        first = dict(registry.active_bindings())
        assert registry.enable()
        assert registry.active_bindings() == first
        # RAGatouille's target is in `first` too where another test imported RAGatouille.
        assert set(registry.active_bindings(["colbert-ai"])) == {t.name for t in TARGETS}
        registry.disable()
        registry.disable()
        assert registry.active_bindings() == {}
        assert not registry.is_enabled()


def test_groups_are_independent():
    with patch_state(()):
        before = _snapshot()
        original_search_all = vars(Searcher)["_search_all_Q"]
        registry.enable(["compat"])
        assert registry.is_enabled(["compat"]) and not registry.is_enabled(["scoring"])
        assert vars(Searcher)["_search_all_Q"] is original_search_all
        registry.enable(["scoring"])
        registry.disable(["compat"])
        assert registry.is_enabled(["scoring"]) and not registry.is_enabled(["compat"])
        after = _snapshot()
        for target in TARGETS:
            for (name, where), value in after.items():
                if name == target.name:
                    assert (value is before[(name, where)]) == (target.group == "compat"), name


def test_context_manager_undoes_only_what_it_did():
    with patch_state(("compat",)):
        with registry.enabled() as ok:
            assert ok and registry.is_enabled(["compat", "scoring"])
        assert registry.is_enabled(["compat"]) and not registry.is_enabled(["scoring"])
    with patch_state(()):
        with registry.enabled(["scoring"]):
            assert registry.is_enabled()
        assert registry.active_bindings() == {}


def test_unknown_group_is_rejected():
    with pytest.raises(ValueError, match="groups"):
        registry.enable(["kernels"])


def test_version_guard_warns_and_leaves_originals(monkeypatch):
    # The fake version is undone before patch_state re-enables what was on before the test.
    with patch_state(()), monkeypatch.context() as patched:
        before = _snapshot()
        patched.setattr(registry, "colbert_version", lambda: "0.2.19")
        with pytest.warns(RuntimeWarning, match="0.2.19"):
            assert registry.enable() is False
        assert _snapshot() == before
        assert not registry.is_enabled()


def test_missing_colbert_is_a_quiet_no_op(monkeypatch):
    with patch_state(()), monkeypatch.context() as patched:
        patched.setattr(registry, "colbert_version", lambda: None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert registry.enable() is False
            assert registry.auto_enable() is False
        # colbert-ai's bindings only: RAGatouille (a library of its own, imported by another
        # test in this process) cannot be imported without colbert-ai outside this fake.
        assert registry.active_bindings(["colbert-ai"]) == {}


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_environment_variable_turns_auto_enable_off(monkeypatch, value):
    with patch_state(()):
        monkeypatch.setenv(registry.DISABLE_ENV_VAR, value)
        assert registry.auto_enable() is False
        assert registry.active_bindings() == {}
        monkeypatch.delenv(registry.DISABLE_ENV_VAR)
        assert registry.auto_enable() is True
        assert registry.is_enabled(["compat", "scoring"])


def test_unknown_library_is_rejected():
    with pytest.raises(ValueError, match="libraries"):
        registry.enable(libraries=["faiss"])
    with pytest.raises(TypeError, match="libraries"):
        registry.enable(libraries="pylate")


def test_every_library_lists_targets_of_its_own_package():
    names = []
    for name, library in registry.LIBRARIES.items():
        targets = registry._targets_of(name)
        assert targets, name
        for target in targets:
            assert target.owner.partition(":")[0].partition(".")[0] == library.package, target.name
            assert target.group in registry.GROUPS, target.name
            names.append(target.name)
    assert len(names) == len(set(names))
    assert set(registry.PLUGIN_LIBRARIES) == {"colbert-ai", "ragatouille"}
    assert registry._targets_of("colbert-ai") == TARGETS


def test_plugin_defaults_leave_pylate_alone(monkeypatch):
    """enable()/disable() without libraries never import or patch PyLate (patch_pylate() does)."""
    with patch_state(()):
        assert registry.enable()
        assert not any(name.startswith("pylate.") for name in registry.active_bindings())
        assert not registry.is_pending(["pylate"])


def test_import_hook_waits_for_a_submodule(tmp_path, monkeypatch):
    """A dotted name: the callback runs once that module itself has been executed."""
    from tilemaxsim_plaid.plaid import import_hook

    package = tmp_path / "hooked_package"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text("from . import scoring\n")
    (package / "models" / "scoring.py").write_text("class Scorer:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    import_hook.call_after_import("hooked_package.models.scoring",
                                  lambda module: calls.append(hasattr(module, "Scorer")))
    try:
        assert import_hook.is_pending("hooked_package.models.scoring")
        import hooked_package  # noqa: F401  (the parent alone does not fire it)
        assert calls == []
        import hooked_package.models  # noqa: F401
        assert calls == [True]
        assert not import_hook.is_pending("hooked_package.models.scoring")
    finally:
        import_hook.cancel("hooked_package.models.scoring")
        for name in ("hooked_package.models.scoring", "hooked_package.models", "hooked_package"):
            monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ValueError, match="module name"):
        import_hook.call_after_import("not a module", print)
