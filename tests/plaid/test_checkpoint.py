"""The offline MiniLM checkpoint reloads identically (the projection is saved, not re-drawn)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("colbert", reason="colbert-ai is not installed (pip install .[colbert])")

from tilemaxsim_plaid.plaid.checkpoint import fixed_projection, build_minilm_checkpoint  # noqa: E402

pytestmark = pytest.mark.colbert


def _linear_weight(path):
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.base_colbert import BaseColBERT

    from tilemaxsim_plaid.plaid.registry import enabled

    with enabled(["compat"]):
        return BaseColBERT(path, colbert_config=ColBERTConfig.load_from_checkpoint(path)).linear.weight.detach()


def test_projection_survives_reload(tiny_plaid_index):
    first = _linear_weight(tiny_plaid_index.checkpoint_path)
    second = _linear_weight(tiny_plaid_index.checkpoint_path)
    assert torch.equal(first, second)
    assert torch.equal(first, fixed_projection(tiny_plaid_index.dim))
    rows = first @ first.T
    torch.testing.assert_close(rows, torch.eye(tiny_plaid_index.dim), rtol=0, atol=1e-5)


def test_full_width_is_the_identity_and_bad_dims_are_rejected(tmp_path):
    assert torch.equal(fixed_projection(384), torch.eye(384))
    for dim in (0, 100, 400):
        with pytest.raises(ValueError, match="dim"):
            build_minilm_checkpoint(tmp_path / str(dim), dim=dim)
