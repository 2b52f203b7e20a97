"""The public ops' outer layer (ops/launch.scoring_op).

Autograd: the kernels have no backward, so scores of inputs that require grad come back with a
backward that raises naming the op (never scores that silently train nothing), and scores of
inputs that do not, or under no_grad / inference_mode, carry no graph. Devices: tensors on a GPU
other than the current one are scored there (Triton launches on the current device)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ON_GPU
from tests.kernels.test_maxsim_pq import random_pq_index
from tests.kernels.test_maxsim_residual import norms_of, random_index
from tilemaxsim_plaid import maxsim_packed, maxsim_padded, maxsim_pq, maxsim_residual, reference


def _dense_packed(device):
    Q = torch.randn(2, 5, 64, device=device)
    D = torch.randn(23, 64, device=device)
    offsets = torch.tensor([0, 7, 7, 20, 23], device=device)
    return maxsim_packed, reference.maxsim_packed, (Q, D, offsets), {}, (0, 1)


def _dense_padded(device):
    Q = torch.randn(2, 5, 64, device=device)
    D = torch.randn(3, 9, 64, device=device)
    lengths = torch.tensor([9, 0, 4], device=device)
    return maxsim_padded, reference.maxsim_padded, (Q, D, lengths), {}, (0, 1)


def _residual(device):
    index = random_index(device, 128, 2, centroid_dtype=torch.float32)
    Q = torch.randn(2, 5, 128, device=device)
    args = (Q, index["codes"], index["residuals"], index["offsets"], index["centroids"],
            index["bucket_weights"], 2)
    return (maxsim_residual, reference.maxsim_residual, args,
            {"inv_norms": norms_of(index, 2)}, (0, 4, 5))


def _pq(device):
    index = random_pq_index(device, 64, 16)
    Q = torch.randn(2, 5, 64, device=device)
    args = (Q, index["pq_codes"], index["offsets"], index["codebooks"])
    return maxsim_pq, reference.maxsim_pq, args, {}, (0, 3)


OPS = [pytest.param(make, id=make.__name__.strip("_"))
       for make in (_dense_packed, _dense_padded, _residual, _pq)]


def _requiring_grad(args, which):
    return tuple(a.detach().clone().requires_grad_(True) if i == which else a
                 for i, a in enumerate(args))


@pytest.mark.parametrize("make", OPS)
def test_scores_of_inputs_requiring_grad_refuse_the_backward(device, make):
    op, _, args, kwargs, float_positions = make(device)
    want = op(*args, **kwargs)
    assert want.grad_fn is None and not want.requires_grad
    for which in float_positions:
        grad_args = _requiring_grad(args, which)
        scores = op(*grad_args, **kwargs)
        assert torch.equal(scores.detach(), want)
        assert scores.requires_grad
        # A loss with another term: the op's missing gradient is an error, not a silent zero.
        loss = scores.nan_to_num(neginf=0.0).sum() + grad_args[which].sum()
        with pytest.raises(RuntimeError, match=f"{op.__name__} has no backward"):
            loss.backward()
        with torch.no_grad():
            assert op(*grad_args, **kwargs).grad_fn is None
        with torch.inference_mode():
            assert not op(*grad_args, **kwargs).requires_grad


@pytest.mark.parametrize("make", OPS)
def test_the_named_reference_trains(device, make):
    """The error's way out: the reference of the same name scores with torch ops, which autograd
    differentiates (here for Q)."""
    _, ref, args, kwargs, _ = make(device)
    Q = args[0].detach().double().requires_grad_(True)
    scores = ref(Q, *args[1:], **kwargs)
    scores.nan_to_num(neginf=0.0).sum().backward()
    assert Q.grad is not None and torch.isfinite(Q.grad).all() and Q.grad.abs().sum() > 0


@pytest.mark.skipif(not ON_GPU or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("make", OPS)
def test_tensors_on_another_gpu_are_scored_there(make):
    """Inputs on cuda:1 while cuda:0 is current score as the same inputs on cuda:0, and the
    current device is left as it was."""
    op, _, args, kwargs, _ = make(torch.device("cuda", 0))
    want = op(*args, **kwargs)
    move = lambda t: t.to("cuda:1") if isinstance(t, torch.Tensor) else t  # noqa: E731
    with torch.cuda.device(0):
        got = op(*map(move, args), **{k: move(v) for k, v in kwargs.items()})
        assert torch.cuda.current_device() == 0
    assert got.device == torch.device("cuda", 1)
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0, equal_nan=True)


def test_the_call_switches_to_a_gpu_that_is_not_current(monkeypatch):
    """The device rule without a second GPU: an input that reports cuda:1 while cuda:0 is
    current is scored inside torch.cuda.device(cuda:1), and one on the current device (or on
    the CPU) without a switch."""
    import contextlib

    from tilemaxsim_plaid.ops.launch import scoring_op

    switched = []

    @contextlib.contextmanager
    def device(d):
        switched.append(torch.device(d))
        yield

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", device)

    class OnGpu(torch.Tensor):
        index = 1

        @property
        def is_cuda(self):
            return True

        @property
        def device(self):
            return torch.device("cuda", self.index)

    inside = []
    op = scoring_op(lambda Q, *rest: inside.append(list(switched)) or torch.zeros(1))
    Q = torch.zeros(2).as_subclass(OnGpu)
    op(Q)
    assert inside[-1] == [torch.device("cuda", 1)]
    switched.clear()
    OnGpu.index = 0
    op(Q)
    op(torch.zeros(2))
    assert switched == []
