"""Where triton has no wheel (issue 27): the package imports, the plugin serves with its exact
torch path, and the kernels raise an ImportError naming triton.

Each check runs in a fresh interpreter where ``sys.modules["triton"] = None`` makes every
``import triton`` fail, as it does where triton is not installed (the ImportError's ``name`` is
"triton" either way), before anything else is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tilemaxsim_plaid import pylate

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_NO_TRITON = """
import json, sys
sys.modules["triton"] = None
"""


def _run(code: str) -> dict:
    # TRITON_INTERPRET=1 as in tests/conftest.py: the integrations' CPU test switch reads it.
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", _NO_TRITON + textwrap.dedent(code)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_package_imports_and_the_kernels_name_triton():
    info = _run("""
        import tilemaxsim_plaid
        errors = {}
        for name in ("maxsim_padded", "maxsim_packed", "maxsim_residual", "maxsim_pq"):
            try:
                getattr(tilemaxsim_plaid, name)
            except ImportError as error:
                errors[name] = [error.name, str(error)]
        try:
            from tilemaxsim_plaid.ops.dense import maxsim_padded
        except ImportError as error:
            errors["ops.dense"] = [error.name, str(error)]
        from tilemaxsim_plaid import reference, stats
        print(json.dumps(dict(errors=errors, version=tilemaxsim_plaid.__version__,
                              stats=type(stats()).__name__,
                              triton_loaded=sys.modules.get("triton") is not None)))
    """)
    assert not info["triton_loaded"] and info["version"]
    assert set(info["errors"]) == {"maxsim_padded", "maxsim_packed", "maxsim_residual",
                                   "maxsim_pq", "ops.dense"}, info
    for name, (module, message) in info["errors"].items():
        assert module == "triton", (name, message)
        assert "triton" in message, (name, message)
    assert "needs triton" in info["errors"]["maxsim_padded"][1]
    assert "torch path" in info["errors"]["maxsim_padded"][1]


@pytest.mark.colbert
def test_the_plugin_scores_with_its_exact_torch_path():
    pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")
    info = _run("""
        import torch
        import tilemaxsim_plaid
        import colbert
        from colbert.modeling.colbert import colbert_score_packed
        from colbert.search.index_storage import IndexScorer
        from tilemaxsim_plaid import reference
        from tilemaxsim_plaid.plaid import registry
        generator = torch.Generator().manual_seed(0)
        lengths = torch.tensor([3, 1, 4, 7])
        Q = torch.nn.functional.normalize(torch.randn(1, 31, 96, generator=generator), dim=-1)
        D = torch.nn.functional.normalize(torch.randn(int(lengths.sum()), 96,
                                                      generator=generator), dim=-1)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        ours = colbert_score_packed(Q, D, lengths)
        expected = reference.maxsim_packed(Q[0].double(), D.double(), offsets)
        torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-5)
        active = registry.active_bindings()
        print(json.dumps(dict(
            enabled=registry.is_enabled(["compat", "scoring"]),
            packed=colbert_score_packed is active["colbert.modeling.colbert.colbert_score_packed"],
            rank=vars(IndexScorer)["rank"]
                 is active["colbert.search.index_storage:IndexScorer.rank"],
            fallbacks=tilemaxsim_plaid.stats().fallbacks,
            triton_loaded=sys.modules.get("triton") is not None)))
    """)
    assert info["enabled"] and info["packed"] and info["rank"], info
    assert not info["triton_loaded"]
    assert info["fallbacks"] == {}, info


def test_pylate_and_ragatouille_backends_hand_over_without_triton():
    """The integrations' tensor check names triton, so PyLate's and RAGatouille's own code run."""
    info = _run("""
        import torch
        from tilemaxsim_plaid import pylate
        with pylate._kernels_on_cpu():
            reason = pylate.tensor_refusal([torch.zeros(2, 3)])
        print(json.dumps(dict(reason=reason)))
    """)
    assert info["reason"] == pylate._NO_TRITON and "triton" in info["reason"]
