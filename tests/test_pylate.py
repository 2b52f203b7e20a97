"""tilemaxsim_plaid.pylate against PyLate's own torch path, and patch_pylate()/unpatch_pylate().

The ground truth is PyLate's function itself (``backend="torch"``) run in float64 on the same
(already rounded) inputs: its masking semantics, not ours. The kernel path is forced on for CPU
tensors (``_kernels_on_cpu``), so the kernels run under TRITON_INTERPRET=1 (tests/conftest.py).
"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from tests.tolerances import ROUNDED_ONCE

pytest.importorskip(
    "pylate.scores",
    reason="PyLate is not installed (CI installs it with: pip install --no-deps pylate==1.6.0)",
)
import pylate.rank  # noqa: E402
import pylate.scores  # noqa: E402
import pylate.scores.colbert as pylate_colbert  # noqa: E402
import pylate.scores.similarity_functions as pylate_similarity  # noqa: E402

from tests.conftest import ON_GPU  # noqa: E402
from tilemaxsim_plaid import pylate as tp  # noqa: E402
from tilemaxsim_plaid import reference, stats  # noqa: E402

# CUDA where there is one (the path users take); on CPU the kernels run under the interpreter.
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

NAMES = ("colbert_scores", "colbert_scores_pairwise", "colbert_kd_scores")
ORIGINALS = {name: getattr(pylate_colbert, name) for name in NAMES}

TOLERANCES = ROUNDED_ONCE
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]


@pytest.fixture(autouse=True)
def _unpatched():
    tp.unpatch_pylate()
    yield
    tp.unpatch_pylate()


def _pylate_fallbacks() -> dict[str, int]:
    return {k: v for k, v in stats().fallbacks.items() if k.startswith("pylate.")}


def _on_kernels(function, *args, **kwargs):
    """Call through the kernel path on CPU and check that it did not fall back."""
    before = _pylate_fallbacks()
    with tp._kernels_on_cpu():
        out = function(*args, **kwargs)
    assert _pylate_fallbacks() == before, "the kernel path fell back to PyLate"
    return out


def _double(x):
    return None if x is None else x.double()


def _check(actual: torch.Tensor, pylate_out: torch.Tensor, reference64: torch.Tensor,
           input_dtype: torch.dtype) -> None:
    """Same shape and dtype as PyLate's result, and values within the result dtype's rounding of
    PyLate's function run in float64.

    PyLate's own fp16/bf16 result is not a tolerance-tight target: it rounds every similarity to
    the input dtype, an error relative to the sum of |per-token maxima|, which exceeds |score|
    when the maxima cancel. So its own result is compared directly only for fp32 inputs."""
    assert actual.shape == pylate_out.shape
    assert actual.dtype == pylate_out.dtype
    assert torch.isfinite(actual).all()
    rtol, atol = TOLERANCES[actual.dtype]
    torch.testing.assert_close(actual.double(), reference64, rtol=rtol, atol=atol)
    if input_dtype == torch.float32:
        torch.testing.assert_close(actual.double(), pylate_out.double(), rtol=2 * rtol,
                                   atol=2 * atol)


def _embeddings(*shape: int, dtype=torch.float32, device=DEVICE) -> torch.Tensor:
    return (torch.randn(*shape, device=device) / shape[-1] ** 0.5).to(dtype)


def _padded_docs(lengths, dim: int, dtype) -> torch.Tensor:
    # As pylate.rank.rerank pads: zero rows past each document's length.
    docs = [_embeddings(n, dim, dtype=dtype) for n in lengths]
    return torch.nn.utils.rnn.pad_sequence(docs, batch_first=True, padding_value=0)


def _masks(B: int, Lq: int, lengths, Ld: int, kind: str):
    """Query and document masks with holes (not only padding) in the given dtype kind."""
    q_mask = torch.rand(B, Lq) > 0.25
    q_mask[:, 0] = True
    d_mask = torch.zeros(len(lengths), Ld, dtype=torch.bool)
    for n, length in enumerate(lengths):
        d_mask[n, :length] = torch.rand(length) > 0.3
        d_mask[n, 0] = True
    dtype = {"bool": torch.bool, "int64": torch.int64, "float32": torch.float32}[kind]
    return q_mask.to(DEVICE, dtype), d_mask.to(DEVICE, dtype)


# Documents of lengths 13, 1 (one token: a query token whose only similarity is negative takes
# the padded zero in PyLate), 7 and 4 in a batch padded to 13.
LENGTHS = (13, 1, 7, 4, 13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_colbert_scores_padded_documents_score_like_pylate(dtype):
    B, Lq, dim = 3, 31, 96
    Q = _embeddings(B, Lq, dim, dtype=dtype)
    D = _padded_docs(LENGTHS, dim, dtype)
    ours = _on_kernels(tp.colbert_scores, Q, D)
    _check(ours, ORIGINALS["colbert_scores"](Q, D, backend="torch"),
           ORIGINALS["colbert_scores"](Q.double(), D.double(), backend="torch"), dtype)
    # The semantics differ from ours: with -inf padding the one-token document scores lower.
    lengths = torch.tensor(LENGTHS, device=DEVICE)
    minus_inf = reference.maxsim_padded(Q.double(), D.double(), doc_lengths=lengths)
    assert (ours[:, 1].double() > minus_inf[:, 1] + 1e-3).all()


@pytest.mark.parametrize("kind", ["bool", "int64", "float32"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_colbert_scores_masks_like_pylate(dtype, kind):
    B, Lq, dim = 3, 31, 96
    Q = _embeddings(B, Lq, dim, dtype=dtype)
    # Masked tokens hold real (non-zero) embeddings: PyLate scores them 0, not what they give.
    D = _embeddings(len(LENGTHS), max(LENGTHS), dim, dtype=dtype)
    q_mask, d_mask = _masks(B, Lq, LENGTHS, max(LENGTHS), kind)
    ours = _on_kernels(tp.colbert_scores, Q, D, queries_mask=q_mask, documents_mask=d_mask)
    _check(ours, ORIGINALS["colbert_scores"](Q, D, q_mask, d_mask, backend="torch"),
           ORIGINALS["colbert_scores"](Q.double(), D.double(), _double(q_mask), _double(d_mask),
                                       backend="torch"), dtype)


@pytest.mark.parametrize("kind", ["list", "numpy"])
def test_colbert_scores_takes_pylates_inputs(kind):
    """Lists and numpy arrays are converted as PyLate converts them; one document of length 1."""
    if kind == "numpy" and ON_GPU:
        pytest.skip("numpy arrays convert to CPU tensors: PyLate's own path scores them")
    Q = _embeddings(2, 5, 16)
    D = _embeddings(3, 1, 16)
    q, d = (Q.cpu().numpy(), D.cpu().numpy()) if kind == "numpy" else (list(Q), list(D))
    ours = _on_kernels(tp.colbert_scores, q, d)
    _check(ours, ORIGINALS["colbert_scores"](q, d, backend="torch"),
           ORIGINALS["colbert_scores"](Q.double(), D.double(), backend="torch").to(ours.device),
           Q.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_colbert_scores_pairwise_like_pylate(dtype):
    dim = 96
    # Lists of varied lengths (PyLate's triplet evaluator passes lists), a document of one token.
    queries = [_embeddings(n, dim, dtype=dtype) for n in (31, 8, 1)]
    docs = [_embeddings(n, dim, dtype=dtype) for n in (1, 13, 5)]
    ours = _on_kernels(tp.colbert_scores_pairwise, queries, docs)
    _check(ours, ORIGINALS["colbert_scores_pairwise"](queries, docs, backend="torch"),
           ORIGINALS["colbert_scores_pairwise"]([q.double() for q in queries],
                                                [d.double() for d in docs], backend="torch"), dtype)
    # 3-D tensors: every row of the padded documents is a token.
    Q = _embeddings(3, 31, dim, dtype=dtype)
    D = _padded_docs((13, 1, 4), dim, dtype)
    ours = _on_kernels(tp.colbert_scores_pairwise, Q, D)
    _check(ours, ORIGINALS["colbert_scores_pairwise"](Q, D, backend="torch"),
           ORIGINALS["colbert_scores_pairwise"](Q.double(), D.double(), backend="torch"), dtype)


@pytest.mark.parametrize("masked", [pytest.param(False, id="no-mask"),
                                    pytest.param(True, id="masks")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_colbert_kd_scores_like_pylate(dtype, masked):
    B, N, Lq, Ld, dim = 2, 3, 31, 7, 96
    Q = _embeddings(B, Lq, dim, dtype=dtype)
    D = _embeddings(B, N, Ld, dim, dtype=dtype)
    q_mask = d_mask = None
    if masked:
        q_mask, d_mask = _masks(B, Lq, (7, 1, 3) * B, Ld, "float32")
        d_mask = d_mask.view(B, N, Ld)
    ours = _on_kernels(tp.colbert_kd_scores, Q, D, q_mask, d_mask)
    _check(ours, ORIGINALS["colbert_kd_scores"](Q, D, q_mask, d_mask, backend="torch"),
           ORIGINALS["colbert_kd_scores"](Q.double(), D.double(), _double(q_mask),
                                          _double(d_mask), backend="torch"), dtype)


# -------------------------------------------------------------------------------------------
# Where the kernels do not apply: PyLate's own function, its result exactly, and a count.


def _fallback(reason_part: str, function, *args, **kwargs):
    before = _pylate_fallbacks()
    with tp._kernels_on_cpu():
        out = function(*args, **kwargs)
    after = _pylate_fallbacks()
    grown = [k for k in after if after[k] > before.get(k, 0)]
    assert grown and reason_part in grown[0], f"expected a fallback for {reason_part!r}: {grown}"
    return out


def test_cpu_tensors_run_pylates_code_without_the_switch():
    Q, D = _embeddings(2, 5, 16, device="cpu"), _embeddings(3, 4, 16, device="cpu")
    before = _pylate_fallbacks()
    out = tp.colbert_scores(Q, D)
    assert _pylate_fallbacks() != before
    assert torch.equal(out, ORIGINALS["colbert_scores"](Q, D))


@pytest.mark.parametrize("case", ["float64", "backend-torch", "env-torch", "grad", "no-triton"])
def test_inputs_the_kernels_do_not_take_get_pylates_result(case, monkeypatch):
    dtype = torch.float64 if case == "float64" else torch.float32
    Q, D = _embeddings(2, 5, 16, dtype=dtype), _embeddings(3, 4, 16, dtype=dtype)
    q_mask = torch.ones(2, 5, device=DEVICE)
    kwargs = {}
    if case == "backend-torch":
        kwargs["backend"] = "torch"
    if case == "env-torch":
        monkeypatch.setenv(tp.BACKEND_ENV_VAR, "torch")
    if case == "grad":
        Q.requires_grad_(True)
    if case == "no-triton":
        monkeypatch.setattr(tp, "_triton_installed", lambda: False)
    reason = {"float64": "dtype", "backend-torch": "backend", "env-torch": "backend",
              "grad": "grad", "no-triton": "triton"}[case]
    out = _fallback(reason, tp.colbert_scores, Q, D, q_mask, **kwargs)
    expected = ORIGINALS["colbert_scores"](Q, D, q_mask, **kwargs)
    assert torch.equal(out, expected)
    if case == "grad":
        # PyLate trains through colbert_scores: the gradient is its torch path's.
        (grad,) = torch.autograd.grad(out.sum(), Q)
        (expected_grad,) = torch.autograd.grad(expected.sum(), Q)
        assert torch.equal(grad, expected_grad)


def test_pylates_errors_stay_pylates():
    Q = _embeddings(2, 5, 16)
    with pytest.raises(IndexError):  # a document of no tokens has no max
        _fallback("empty", tp.colbert_scores, Q, _embeddings(3, 0, 16))
    with pytest.raises(RuntimeError):  # mixed dtypes: einsum refuses
        _fallback("dtype", tp.colbert_scores, Q.half(), _embeddings(3, 4, 16))
    with pytest.raises(ValueError):  # PyLate validates the backend name
        tp.colbert_scores(Q, _embeddings(3, 4, 16), backend="bogus")


def test_the_kernel_path_needs_no_pylate(monkeypatch):
    for name in [m for m in sys.modules if m == "pylate" or m.startswith("pylate.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import pylate...` now raises ImportError
    Q, D = _embeddings(2, 5, 16), _embeddings(3, 4, 16)
    ours = _on_kernels(tp.colbert_scores, Q, D)
    monkeypatch.undo()
    torch.testing.assert_close(ours, ORIGINALS["colbert_scores"](Q, D), rtol=1e-5, atol=1e-5)


def test_a_mask_of_another_shape_goes_to_pylate():
    Q, D = _embeddings(2, 5, 16), _embeddings(3, 4, 16)
    d_mask = torch.ones(1, 4, device=DEVICE)  # broadcasts in PyLate's product
    out = _fallback("mask", tp.colbert_scores, Q, D, None, d_mask)
    assert torch.equal(out, ORIGINALS["colbert_scores"](Q, D, None, d_mask))


# -------------------------------------------------------------------------------------------
# patch_pylate / unpatch_pylate


@pytest.mark.parametrize("name", NAMES)
def test_signatures_are_pylates(name):
    ours = inspect.signature(getattr(tp, name))
    theirs = inspect.signature(ORIGINALS[name])
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.parameters.values()]


def _bindings():
    return {
        "colbert_scores": [pylate_colbert, pylate.scores, pylate_similarity, pylate.rank.rank],
        "colbert_scores_pairwise": [pylate_colbert, pylate.scores, pylate_similarity],
        "colbert_kd_scores": [pylate_colbert, pylate.scores],
    }


def test_patch_replaces_every_binding_and_unpatch_restores_the_originals(caplog):
    with caplog.at_level("INFO", logger=tp.__name__):
        assert tp.patch_pylate() is True
    assert "TileMaxSim kernels" in caplog.text
    assert tp.is_patched()
    replacements = {name: getattr(pylate_colbert, name) for name in NAMES}
    for name, modules in _bindings().items():
        assert replacements[name] is not ORIGINALS[name]
        assert replacements[name].__wrapped__ is ORIGINALS[name]
        assert replacements[name].__name__ == name
        for module in modules:
            assert getattr(module, name) is replacements[name], (module.__name__, name)
    assert set(tp.active_bindings().values()) == set(replacements.values())
    # The model's similarity() resolves through similarity_functions at call time.
    similarity = pylate_similarity.SimilarityFunction
    assert similarity.to_similarity_fn("MaxSim") is replacements["colbert_scores"]
    assert similarity.to_similarity_pairwise_fn("MaxSim") is replacements["colbert_scores_pairwise"]
    # Twice: nothing changes, in particular the originals stay the originals.
    assert tp.patch_pylate() is True
    for name in NAMES:
        assert getattr(pylate_colbert, name) is replacements[name]
        assert replacements[name].__wrapped__ is ORIGINALS[name]
    tp.unpatch_pylate()
    assert not tp.is_patched()
    for name, modules in _bindings().items():
        for module in modules:
            assert getattr(module, name) is ORIGINALS[name], (module.__name__, name)
    tp.unpatch_pylate()
    assert getattr(pylate_colbert, "colbert_scores") is ORIGINALS["colbert_scores"]


def test_modules_imported_while_patched_get_the_originals_back(monkeypatch):
    """An evaluator or loss imported while patched binds the replacement from pylate.scores
    (stand-ins here: the real ones import sentence-transformers); unpatching restores it, the
    loss's captured default argument included."""
    assert tp.patch_pylate()
    triplet = types.ModuleType("pylate.evaluation.colbert_triplet")
    triplet.colbert_scores_pairwise = pylate.scores.colbert_scores_pairwise
    distillation = types.ModuleType("pylate.losses.distillation")
    distillation.colbert_kd_scores = pylate.scores.colbert_kd_scores

    class Distillation:
        def __init__(self, model, score_metric=distillation.colbert_kd_scores, size_average=True):
            self.score_metric = score_metric

    distillation.Distillation = Distillation
    monkeypatch.setitem(sys.modules, triplet.__name__, triplet)
    monkeypatch.setitem(sys.modules, distillation.__name__, distillation)
    tp.unpatch_pylate()
    assert triplet.colbert_scores_pairwise is ORIGINALS["colbert_scores_pairwise"]
    assert distillation.colbert_kd_scores is ORIGINALS["colbert_kd_scores"]
    assert Distillation(None).score_metric is ORIGINALS["colbert_kd_scores"]


def test_patch_keeps_a_previous_patch_and_restores_it():
    """Another library's patch in place first (as late-interaction-kernels' patch_pylate() does
    on older PyLate) is what the replacement wraps and what unpatching puts back."""
    def peer(*args, **kwargs):
        return ORIGINALS["colbert_scores"](*args, **kwargs)

    pylate_colbert.colbert_scores = pylate.scores.colbert_scores = peer
    try:
        assert tp.patch_pylate()
        assert pylate_colbert.colbert_scores.__wrapped__ is peer
        tp.unpatch_pylate()
        assert pylate_colbert.colbert_scores is peer and pylate.scores.colbert_scores is peer
        assert pylate.rank.rank.colbert_scores is ORIGINALS["colbert_scores"]
    finally:
        pylate_colbert.colbert_scores = pylate.scores.colbert_scores = ORIGINALS["colbert_scores"]


def test_unsupported_pylate_version_is_refused(monkeypatch):
    monkeypatch.setattr(tp, "pylate_version", lambda: "0.0.1")
    with pytest.warns(RuntimeWarning, match="0.0.1"):
        assert tp.patch_pylate() is False
    assert not tp.is_patched()
    for name in NAMES:
        assert getattr(pylate_colbert, name) is ORIGINALS[name]


def test_rerank_through_the_patch_ranks_as_pylate():
    dim = 96
    queries = _embeddings(2, 31, dim)
    docs = [[_embeddings(n, dim) for n in (13, 1, 7, 4, 20, 2)],
            [_embeddings(n, dim) for n in (5, 1, 9)]]
    ids = [[f"d{i}" for i in range(len(group))] for group in docs]
    expected = pylate.rank.rerank(ids, queries, docs)
    assert tp.patch_pylate()
    before = _pylate_fallbacks()
    with tp._kernels_on_cpu():
        ours = pylate.rank.rerank(ids, queries, docs)
    assert _pylate_fallbacks() == before, "rerank did not score on the kernels"
    tp.unpatch_pylate()
    for got, want in zip(ours, expected):
        assert [r["id"] for r in got] == [r["id"] for r in want]
        torch.testing.assert_close(torch.tensor([r["score"] for r in got]),
                                   torch.tensor([r["score"] for r in want]), rtol=1e-5, atol=1e-5)


def test_colbert_scores_class_scores_through_the_patch():
    """ColBERTScores (PyLate's contrastive scoring) resolves colbert_scores at call time."""
    Q = _embeddings(2, 5, 16)
    D = _embeddings(2, 3, 4, 16)  # [Q_doc, N, Ld, d]
    expected = pylate.scores.ColBERTScores()(Q, D)
    assert tp.patch_pylate()
    ours = _on_kernels(pylate.scores.ColBERTScores(), Q, D)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
