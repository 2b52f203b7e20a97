"""Every TILEMAXSIM_PLAID_* variable is checked on every backend, and its error lists what it takes."""

from __future__ import annotations

import pytest
import torch

from tilemaxsim_plaid.plaid import environment

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(
    "name, value, allowed",
    [
        pytest.param(environment.DISABLE_ENV_VAR, "maybe", "'1', 'true'", id="disable"),
        pytest.param(environment.BACKEND_ENV_VAR, "cuda", "('triton', 'torch')", id="backend"),
        pytest.param(environment.PRODUCTS_ENV_VAR, "bogus", "('auto', 'tf32x3', 'fp16x2', 'fp16')",
                     id="products"),
        pytest.param(environment.GRAPHS_ENV_VAR, "2", "'0', 'false'", id="graphs"),
    ],
)
@pytest.mark.parametrize("device", [CPU, CUDA], ids=["cpu", "cuda"])
def test_bad_values_are_refused_on_every_backend(monkeypatch, name, value, allowed, device):
    # The torch backend (CPU) reads the products too, so a misspelling is not silently ignored.
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name) as error:
        environment.check(device)
    assert allowed in str(error.value) and repr(value) in str(error.value)


def test_defaults_and_spellings(monkeypatch):
    for name in (environment.DISABLE_ENV_VAR, environment.BACKEND_ENV_VAR,
                 environment.PRODUCTS_ENV_VAR, environment.GRAPHS_ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    assert environment.backend_for(CPU) == "torch" and environment.backend_for(CUDA) == "triton"
    assert environment.stage_4_products() == "auto"
    assert environment.cuda_graphs_allowed() and not environment.plugin_disabled()
    monkeypatch.setenv(environment.GRAPHS_ENV_VAR, " Off ")
    monkeypatch.setenv(environment.DISABLE_ENV_VAR, "YES")
    monkeypatch.setenv(environment.PRODUCTS_ENV_VAR, "FP16x2")
    monkeypatch.setenv(environment.BACKEND_ENV_VAR, "Torch")
    assert not environment.cuda_graphs_allowed() and environment.plugin_disabled()
    assert environment.stage_4_products() == "fp16x2"
    assert environment.backend_for(CUDA) == "torch"


def test_triton_backend_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(environment.BACKEND_ENV_VAR, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs the index on a CUDA device, but it is on cpu"):
        environment.backend_for(CPU)
    assert environment.backend_for(CUDA) == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the tests' interpreter runs it on the CPU
    assert environment.backend_for(CPU) == "triton"
    triton = pytest.importorskip("triton")
    if hasattr(triton, "knobs"):  # 3.4 on read the variable as a flag, "true" too
        monkeypatch.setenv("TRITON_INTERPRET", "true")
        assert environment.backend_for(CPU) == "triton"


def test_cuda_without_triton_serves_with_torch(monkeypatch):
    """A CUDA machine without triton (Windows) takes the exact torch path; asking for triton
    there is refused naming the package."""
    from tilemaxsim_plaid.plaid import environment

    monkeypatch.delenv(environment.BACKEND_ENV_VAR, raising=False)
    monkeypatch.setattr(environment, "_triton_installed", lambda: False)
    assert environment.backend_for(torch.device("cuda", 0)) == "torch"
    assert environment.backend_for(torch.device("cpu")) == "torch"
    monkeypatch.setenv(environment.BACKEND_ENV_VAR, "triton")
    with pytest.raises(ValueError, match="needs triton: "):
        environment.backend_for(torch.device("cuda", 0))
    monkeypatch.setattr(environment, "_triton_installed", lambda: True)
    monkeypatch.delenv(environment.BACKEND_ENV_VAR)
    assert environment.backend_for(torch.device("cuda", 0)) == "triton"
