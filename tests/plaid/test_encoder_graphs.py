"""The query encoder's graph path: what it captures must be colbert-ai's ``ColBERT.query``
exactly, and the capture / check / fallback logic. Capture itself needs a GPU: the GPU
benchmark (experiments/bench_plaid.py) reports whether each encoder ran as a graph."""

from __future__ import annotations

import logging
import types

import pytest
import torch

from tests.plaid.conftest import patch_state
from tilemaxsim_plaid.plaid import encoder_graphs, graphs, query_tokens

pytestmark = pytest.mark.colbert


@pytest.fixture(scope="module")
def checkpoint_and_inputs(tiny_searcher, tiny_plaid_index):
    with patch_state(("compat",)):
        checkpoint = tiny_searcher.checkpoint
        ids, mask = checkpoint.query_tokenizer.tensorize(tiny_plaid_index.queries[:3])
    return checkpoint, ids, mask


def test_captured_computation_is_colbert_query_bit_for_bit(checkpoint_and_inputs):
    """Every attention-mask form tried with the installed transformers gives exactly colbert-ai's
    eager output (same mask, same ops)."""
    from colbert.modeling.checkpoint import Checkpoint

    checkpoint, ids, mask = checkpoint_and_inputs
    assert (mask == 0).any(), "the inputs must include padded positions for this to mean anything"
    with patch_state(("compat",)):
        expected = Checkpoint.query(checkpoint, ids, mask)
    forms = encoder_graphs._mask_forms()
    assert forms
    for form in forms:
        for cast_once in (True, False):
            got = encoder_graphs._encode(checkpoint, ids, mask, form, cast_once=cast_once)
            assert got.dtype == expected.dtype and torch.equal(got, expected), (form, cast_once)


class _FakeCapture:
    """Stands in for _CapturedEncoder: 'fails' or returns eager output plus an offset."""

    outcomes: dict = {}
    made: list = []
    tried: list = []

    def __init__(self, checkpoint, input_ids, attention_mask, form, cast_once=False):
        self.tried.append((form, cast_once))
        outcome = self.outcomes[form]
        if outcome == "fail":  # a sync inside the capture
            raise RuntimeError("operation not permitted when stream is capturing")
        if outcome == "reject":  # the model refuses the mask form (transformers 5 and [B, L, L])
            raise ValueError("attention mask of unexpected shape")
        self.offset = outcome
        self.made.append(form)

    def __call__(self, input_ids, attention_mask):
        return eager_encoder(None, input_ids, attention_mask) + self.offset


def eager_encoder(checkpoint, input_ids, attention_mask, to_cpu=False):
    return torch.nn.functional.normalize(input_ids.float()[..., None].expand(-1, -1, 4), dim=-1)


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(graphs, "enabled_for_device", lambda device: True)
    monkeypatch.setattr(encoder_graphs, "_CapturedEncoder", _FakeCapture)
    _FakeCapture.made = []
    _FakeCapture.tried = []
    embeddings = types.SimpleNamespace(weight=torch.zeros(2))
    checkpoint = types.SimpleNamespace(
        training=False, device=torch.device("cpu"), linear=types.SimpleNamespace(weight=torch.zeros(3)),
        bert=types.SimpleNamespace(get_input_embeddings=lambda: embeddings))
    ids = torch.arange(1, 9).reshape(1, 8)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0  # padded positions, as almost every tokenized query has
    return checkpoint, ids, mask


@pytest.fixture
def two_forms(monkeypatch):
    monkeypatch.setattr(encoder_graphs, "_mask_forms", lambda: ("square", "padding"))


def test_first_exact_form_is_kept_and_replayed(fake_gpu, two_forms):
    checkpoint, ids, mask = fake_gpu
    _FakeCapture.outcomes = {"square": "fail", "padding": 0.0}
    out = encoder_graphs.query(eager_encoder, checkpoint, ids, mask)
    assert torch.equal(out, eager_encoder(None, ids, mask))
    encoder_graphs.query(eager_encoder, checkpoint, ids, mask, to_cpu=True)
    assert _FakeCapture.made == ["padding"], "captured once, on the second form, then replayed"
    # Each form first with the attention inputs cast once, then as autocast casts them.
    assert _FakeCapture.tried == [("square", True), ("square", False), ("padding", True)]


def test_a_graph_that_is_not_bit_identical_is_never_used(fake_gpu, two_forms, caplog):
    checkpoint, ids, mask = fake_gpu
    _FakeCapture.outcomes = {"square": 1e-7, "padding": "reject"}
    calls = []

    def counting_eager(*args, **kwargs):
        calls.append(1)
        return eager_encoder(*args, **kwargs)

    with caplog.at_level(logging.WARNING, logger=encoder_graphs.__name__):
        for _ in range(3):
            out = encoder_graphs.query(counting_eager, checkpoint, ids, mask)
            assert torch.equal(out, eager_encoder(None, ids, mask))
    assert "differs from the eager encoder" in caplog.text and "capture failed (ValueError" in caplog.text
    assert caplog.text.count("runs eagerly") == 1, "logged once per shape"
    assert len(calls) == 4, "one check at capture, then eager for each of the 3 calls"


@pytest.mark.parametrize("case", ["big batch", "keyword", "training", "graphs off", "1-d", "no padding"])
def test_calls_the_graph_cannot_serve_go_to_colbert(fake_gpu, two_forms, monkeypatch, case):
    checkpoint, ids, mask = fake_gpu
    _FakeCapture.outcomes = {"square": 0.0, "padding": 0.0}
    args, kwargs = (ids, mask), {}
    if case == "big batch":
        args = (ids.expand(encoder_graphs.MAX_GRAPH_BATCH + 1, -1),) * 2
    elif case == "keyword":
        args, kwargs = (), {"input_ids": ids, "attention_mask": mask}
    elif case == "training":
        checkpoint.training = True
    elif case == "graphs off":
        monkeypatch.setattr(graphs, "enabled_for_device", lambda device: False)
    elif case == "1-d":
        args = (ids[0], mask[0])
    elif case == "no padding":  # transformers would drop the mask: not what a graph holds
        args = (ids, torch.ones_like(mask))
    seen = []
    encoder_graphs.query(lambda *a, **k: seen.append((a, k)), checkpoint, *args, **kwargs)
    assert len(seen) == 1 and _FakeCapture.made == []


@pytest.mark.parametrize("tagged_padding", [True, False])
def test_the_host_tokenizer_padding_tag_decides_without_reading_the_mask(fake_gpu, two_forms, tagged_padding):
    """The mask's tag from query_tokens, not its values, decides graph or colbert-ai (the values
    here say the opposite, so the choice shows which one was read)."""
    checkpoint, ids, mask = fake_gpu
    _FakeCapture.outcomes = {"square": 0.0, "padding": 0.0}
    mask = torch.ones_like(mask) if tagged_padding else mask
    setattr(mask, query_tokens.HAS_PADDING_ATTRIBUTE, tagged_padding)
    seen = []
    encoder_graphs.query(lambda *a, **k: seen.append(a) or eager_encoder(*a), checkpoint, ids, mask)
    if tagged_padding:
        assert _FakeCapture.made == ["square"] and len(seen) == 1, "captured (checked once against eager)"
    else:
        assert _FakeCapture.made == [] and len(seen) == 1, "colbert-ai's code, no graph"


def test_moved_weights_get_a_new_graph(fake_gpu, two_forms):
    checkpoint, ids, mask = fake_gpu
    _FakeCapture.outcomes = {"square": 0.0, "padding": 0.0}
    encoder_graphs.query(eager_encoder, checkpoint, ids, mask)
    checkpoint.linear.weight = torch.zeros(3)  # new storage, as after .to()
    encoder_graphs.query(eager_encoder, checkpoint, ids, mask)
    assert _FakeCapture.made == ["square", "square"]


@pytest.fixture
def encoder_copy(checkpoint_and_inputs):
    """The tiny checkpoint's encoder (bert and projection) copied, so tests may change weights."""
    import copy

    checkpoint, ids, mask = checkpoint_and_inputs
    encoder = types.SimpleNamespace(bert=copy.deepcopy(checkpoint.bert), linear=copy.deepcopy(checkpoint.linear))
    return encoder, ids, mask


def _forward(encoder, ids, mask, copies=None):
    bert_params = copies.bert if copies else {}
    projection_params = copies.projection if copies else {}
    hidden = torch.func.functional_call(encoder.bert, bert_params, (ids,), {"attention_mask": mask},
                                        tie_weights=False)[0]
    return torch.func.functional_call(encoder.linear, projection_params, (hidden,), tie_weights=False)


def test_linear_weight_copies_give_exactly_the_autocast_output(encoder_copy):
    """The graph's premise: under autocast a Linear reading a weight pre-rounded to the autocast
    dtype computes exactly what it computes from the fp32 weight. On the GPU this is fp16 (and the
    graph is also checked against colbert-ai); the CPU's autocast dtype, bf16, tests the same
    substitution here."""
    encoder, ids, mask = encoder_copy
    copies = encoder_graphs.LinearWeightCopies(encoder, torch.bfloat16)
    linears = [m for m in encoder.bert.modules() if isinstance(m, torch.nn.Linear)]
    expected_count = sum(1 + (m.bias is not None) for m in linears) + 1 + (encoder.linear.bias is not None)
    assert len(copies.bert) + len(copies.projection) == expected_count
    assert all(t.dtype == torch.bfloat16 for t in [*copies.bert.values(), *copies.projection.values()])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        expected = _forward(encoder, ids, mask)
        got = _forward(encoder, ids, mask, copies)
    assert got.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(got, expected)
    # The equality is not vacuous: the copies are read (zeroing one changes the output) and they
    # hold rounded values, not the fp32 weights.
    zeroed_projection = {"weight": torch.zeros_like(copies.projection["weight"])}
    zeroed = types.SimpleNamespace(bert=dict(copies.bert), projection=zeroed_projection)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        assert not torch.equal(_forward(encoder, ids, mask, zeroed), expected)
    assert not torch.equal(copies.projection["weight"].float(), encoder.linear.weight.detach())


def test_linear_weight_copies_follow_weight_updates(encoder_copy):
    encoder, ids, mask = encoder_copy
    copies = encoder_graphs.LinearWeightCopies(encoder, torch.float16)
    assert copies.refresh() == 0, "nothing changed"
    layer = next(m for m in encoder.bert.modules() if isinstance(m, torch.nn.Linear))
    name = next(k for k, v in copies.bert.items() if k.endswith(".weight"))
    with torch.no_grad():
        layer.weight.mul_(3.0)  # an in-place update, as an optimizer step makes
    assert copies.refresh() == 1
    assert torch.equal(copies.bert[name], layer.weight.detach().half())
    encoder.linear.weight = torch.nn.Parameter(torch.randn_like(encoder.linear.weight))  # replaced
    assert copies.refresh() == 1
    assert torch.equal(copies.projection["weight"], encoder.linear.weight.detach().half())
    assert copies.refresh() == 0


def test_token_pair_finds_the_host_tokenizers_single_upload():
    """The graph copies ids and mask in one go only when they are the two halves, in order, of
    one contiguous [2, B, L] tensor (what query_tokens uploads); any other pair is copied apart."""
    both = torch.arange(2 * 3 * 8).reshape(2, 3, 8).clone()  # a tensor of its own, as an upload is
    assert encoder_graphs.token_pair(both[0], both[1]) is both
    assert encoder_graphs.token_pair(both[1], both[0]) is None, "swapped halves"
    ids, mask = both[0].clone(), both[1].clone()
    assert encoder_graphs.token_pair(ids, mask) is None, "separate tensors"
    assert encoder_graphs.token_pair(both[0][:, :4], both[1][:, :4]) is None, "slices of the halves"
    wide = torch.arange(3 * 3 * 8).reshape(3, 3, 8).clone()
    assert encoder_graphs.token_pair(wide[0], wide[1]) is None, "halves of something else"
    strided = torch.arange(2 * 8 * 3).reshape(2, 8, 3).clone().transpose(1, 2)
    assert encoder_graphs.token_pair(strided[0], strided[1]) is None, "not contiguous"


def test_attention_inputs_cast_once_changes_no_bit(encoder_copy):
    """Casting each self-attention block's input once, instead of once per query/key/value
    Linear, gives exactly autocast's output (CPU autocast, bf16, stands in for the GPU's fp16),
    and the q/k/v layers do receive the cast input."""
    encoder, ids, mask = encoder_copy
    copies = encoder_graphs.LinearWeightCopies(encoder, torch.bfloat16)
    seen = []
    probe = next(m for m in encoder.bert.modules() if isinstance(getattr(m, "query", None), torch.nn.Linear))
    handle = probe.query.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            expected = _forward(encoder, ids, mask, copies)
            with encoder_graphs.attention_inputs_cast_once(encoder.bert) as blocks:
                got = _forward(encoder, ids, mask, copies)
    finally:
        handle.remove()
    assert blocks == encoder.bert.config.num_hidden_layers
    assert seen == [torch.float32, torch.bfloat16], "autocast casts inside the Linear; the hook before it"
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    # The hooks are gone after the block, and do nothing without autocast.
    with torch.no_grad():
        plain = _forward(encoder, ids, mask)
        with encoder_graphs.attention_inputs_cast_once(encoder.bert):
            assert torch.equal(_forward(encoder, ids, mask), plain)
    assert not any(m._forward_pre_hooks for m in encoder.bert.modules())
