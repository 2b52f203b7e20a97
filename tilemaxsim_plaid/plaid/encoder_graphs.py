"""One CUDA graph per (checkpoint, batch shape) for colbert-ai's query encoder.

A ColBERT query is always ``query_maxlen`` tokens (short queries are padded with [MASK]), so
``Checkpoint.query`` sees the same input shape for every single-query search. Eagerly, encoding
one query is a few hundred small launches (BERT's layers, the projection, the normalisation)
plus one host sync: ``ColBERT.query`` builds its token mask as a Python list from
``input_ids.cpu()``. For the 32 tokens of one query that is milliseconds of Python and launch
overhead around microseconds of GPU work, more than the plugin's whole PLAID search.

Here the same computation (BERT, ``linear``, the mask computed on the device, L2
normalisation, under the same autocast) is captured once per (checkpoint, input shape) and
replayed. Before a graph is used its output for the capture input is compared with colbert-ai's
own eager ``Checkpoint.query`` on that input: the graph is kept only if both are bit-identical,
otherwise that shape runs eagerly from then on and the reason is logged once. Rankings
therefore never depend on whether the encoder ran as a graph.

The attention mask is passed in the form the installed transformers can capture
(:func:`_mask_forms`). transformers 4.x's SDPA path checks ``torch.all(mask == 1)`` on the host
for a ``[B, L]`` mask (a sync, which capture forbids); the equivalent ``[B, L, L]`` form goes
through ``get_extended_attention_mask``, the same additive mask without the check.
transformers 5 skips that check while a CUDA stream is capturing and rejects ``[B, L, L]``, so
there the ``[B, L]`` mask is captured as is.

Batches with no padded position at all run colbert-ai's own code: transformers drops an all-ones
mask, and SDPA without a mask may use a different kernel than with one (see :func:`query`).
Only batches of at most :data:`MAX_GRAPH_BATCH` queries are graphed: larger ones (``search_all``
encodes 128 at a time) are bound by the GPU's work, not by launches, and run eagerly.

Under colbert-ai's autocast every ``nn.Linear`` casts its fp32 weight to fp16 on each call: for
BERT-base that is 73 cast kernels reading 340 MB per query, inside the graph as much as outside.
The graph instead reads fp16 copies of those weights (:class:`LinearWeightCopies`, one set per
checkpoint and device: 170 MB for BERT-base). autocast rounds a weight to fp16 exactly as the copy
was rounded, so the output is unchanged, and the bit-identity check above confirms it for every
graph. Before each replay the copies are refreshed for any weight that changed since: an in-place
update (the tensor's version counter) or a replaced parameter (its storage). Edits through
``.data`` bypass version counters and are not seen; code that edits weights that way while
searching should turn the graphs off. Moving the model (``.to()``) makes new parameter storage and
a new key. ``TILEMAXSIM_PLAID_CUDA_GRAPHS=0`` and :func:`tilemaxsim_plaid.plaid.graphs.disabled`
turn these graphs off.

Autocast also casts each self-attention block's fp32 input three times, once in each of its
``query``, ``key`` and ``value`` layers. The graph is first captured with that input cast once
(:func:`attention_inputs_cast_once`; the same ``.to(fp16)``, so the same values), which removes
two cast kernels per layer; if that graph were not bit-identical, the plain form is tried next.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from tilemaxsim_plaid.plaid import counters, graphs, query_tokens

__all__ = ["MAX_GRAPH_BATCH", "LinearWeightCopies", "query"]

logger = logging.getLogger(__name__)

MAX_GRAPH_BATCH = 32
MAX_GRAPHS_PER_CHECKPOINT = 8
_CACHE_ATTRIBUTE = "_tilemaxsim_encoder_graphs"
_COPIES_ATTRIBUTE = "_tilemaxsim_linear_weight_copies"


def _mask_forms() -> tuple[str, ...]:
    """Attention-mask forms to capture, the one the installed transformers takes first."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return ("padding",)
    return ("square", "padding")


def _graph_inputs(checkpoint, args, kwargs):
    """(input_ids, attention_mask) when this call can be served by a graph, else None."""
    if kwargs or len(args) != 2 or checkpoint.training:
        return None
    input_ids, attention_mask = args
    if not (isinstance(input_ids, torch.Tensor) and isinstance(attention_mask, torch.Tensor)):
        return None
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        return None
    if not 0 < input_ids.shape[0] <= MAX_GRAPH_BATCH:
        return None
    # The projection's device is the model's (colbert-ai keeps the model on one device), and
    # reading it skips transformers' walk over the parameters behind ``checkpoint.device``.
    device = checkpoint.linear.weight.device
    if not graphs.enabled_for_device(device):
        return None
    return input_ids.to(device), attention_mask.to(device)


_VERSION = operator.attrgetter("_version")


class LinearWeightCopies:
    """Copies, in ``dtype``, of every ``nn.Linear`` weight and bias of a checkpoint's encoder
    (``bert`` and the ``linear`` projection), as the parameter dicts that
    :func:`torch.func.functional_call` substitutes for the originals.

    :meth:`refresh` re-copies whatever changed since the last copy, so the copies always hold
    the current weights rounded to ``dtype``, the values autocast would compute."""

    def __init__(self, checkpoint, dtype: torch.dtype):
        self.dtype = dtype
        self.bert: dict[str, torch.Tensor] = {}
        self.projection: dict[str, torch.Tensor] = {}
        # Per weight: where it lives (the module's parameter dict and its name), its copy, and
        # the parameter object and version last copied. Parallel lists, so the per-replay check
        # is three list passes rather than a Python loop over ~150 weights (BERT-base).
        self._dicts, self._names, self._copies, self._seen, self._versions = [], [], [], [], []
        for params, root in ((self.bert, checkpoint.bert), (self.projection, checkpoint.linear)):
            for module_name, module in root.named_modules():
                if not isinstance(module, torch.nn.Linear):
                    continue
                for name in ("weight", "bias"):
                    param = module._parameters.get(name)
                    if param is None:
                        continue
                    copy = param.detach().to(dtype=dtype, copy=True)
                    params[f"{module_name}.{name}" if module_name else name] = copy
                    self._dicts.append(module._parameters)
                    self._names.append(name)
                    self._copies.append(copy)
                    self._seen.append(param)
                    self._versions.append(param._version)

    def refresh(self) -> int:
        """Re-copy every weight updated in place or replaced since its last copy; how many."""
        # map() keeps the per-weight loop in C: this runs before every replay.
        current = list(map(operator.getitem, self._dicts, self._names))
        versions = list(map(_VERSION, current))
        if versions == self._versions and all(map(operator.is_, current, self._seen)):
            return 0
        refreshed = 0
        for i, (param, version) in enumerate(zip(current, versions)):
            if param is self._seen[i] and version == self._versions[i]:
                continue
            self._copies[i].copy_(param.detach())
            self._seen[i], self._versions[i] = param, param._version
            refreshed += 1
        return refreshed


def _linear_weight_copies(checkpoint, device: torch.device):
    """The checkpoint's fp16 Linear copies for ``device``, or None when colbert-ai's autocast is
    off (then no cast happens and the graph reads the parameters themselves)."""
    amp = bool(getattr(getattr(checkpoint, "amp_manager", None), "activated", False))
    if not (amp and device.type == "cuda"):
        return None
    dtype = torch.get_autocast_dtype("cuda")
    if checkpoint.linear.weight.dtype == dtype:
        return None
    copies = checkpoint.__dict__.setdefault(_COPIES_ATTRIBUTE, {})
    key = (device, dtype)
    if key not in copies:
        copies[key] = LinearWeightCopies(checkpoint, dtype)
    return copies[key]


def _cast_hidden_states_once(module, args, kwargs):
    """Forward pre-hook of a self-attention block: its input in the autocast dtype.

    Under autocast each of the block's ``query``, ``key`` and ``value`` Linear layers casts the
    same fp32 input to fp16 on its own: three cast kernels per layer where one gives the same
    values (autocast's cast is a plain ``.to(dtype)``, and it leaves an input already in its
    dtype alone). The residual path keeps the fp32 tensor: only this block's input changes.
    """
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(hidden, torch.Tensor) or hidden.dtype != torch.float32:
        return None
    device_type = hidden.device.type
    if not torch.is_autocast_enabled(device_type):
        return None
    cast = hidden.to(torch.get_autocast_dtype(device_type))
    if args:
        return (cast, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": cast}


@contextlib.contextmanager
def attention_inputs_cast_once(bert: torch.nn.Module) -> Iterator[int]:
    """Within the block, every self-attention module of ``bert`` (one with ``query``, ``key``
    and ``value`` Linear children) casts its input once (:func:`_cast_hidden_states_once`).
    Yields how many modules that is (0 for an architecture without such blocks)."""
    blocks = [module for module in bert.modules()
              if all(isinstance(getattr(module, name, None), torch.nn.Linear) for name in ("query", "key", "value"))]
    handles = [block.register_forward_pre_hook(_cast_hidden_states_once, with_kwargs=True) for block in blocks]
    try:
        yield len(handles)
    finally:
        for handle in handles:
            handle.remove()


def _encode(checkpoint, input_ids, attention_mask, mask_form: str, weights=None, cast_once: bool = False):
    """``ColBERT.query`` without host work: the token mask is computed on the device. With
    ``weights`` (a :class:`LinearWeightCopies`) the Linear layers read those copies."""
    if mask_form == "square":
        # [B, L, L]: every query position sees the same keys as in the [B, L] form.
        attention_mask = attention_mask[:, None, :].expand(-1, attention_mask.shape[1], -1)
    amp = bool(getattr(getattr(checkpoint, "amp_manager", None), "activated", False))
    bert_params = weights.bert if weights is not None else {}
    projection_params = weights.projection if weights is not None else {}
    # Autocast's weight-cast cache must stay off inside a graph (the casts are re-run by every
    # replay instead of being cached outside it); the casts themselves are the same.
    casts = attention_inputs_cast_once(checkpoint.bert) if cast_once else contextlib.nullcontext()
    with torch.no_grad(), torch.autocast("cuda", enabled=amp and input_ids.is_cuda, cache_enabled=False), casts:
        # tie_weights=False: only the Linear weights are substituted, never a tensor tied to one.
        Q = torch.func.functional_call(checkpoint.bert, bert_params, (input_ids,),
                                       {"attention_mask": attention_mask}, tie_weights=False)[0]
        Q = torch.func.functional_call(checkpoint.linear, projection_params, (Q,), tie_weights=False)
        pad = checkpoint.pad_token
        keep = torch.ones_like(input_ids, dtype=torch.bool) if pad is None else input_ids != pad
        Q = Q * keep.unsqueeze(2).float()
        return F.normalize(Q, p=2, dim=2)


def token_pair(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The contiguous ``[2, B, L]`` tensor whose halves are ``input_ids`` and ``attention_mask``
    (in that order), as the host tokenizer returns them; None for any other pair."""
    base = input_ids._base
    if base is None or attention_mask._base is not base or base.dim() != 3 or base.shape[0] != 2:
        return None
    if not base.is_contiguous() or base.shape[1:] != input_ids.shape or base.dtype != attention_mask.dtype:
        return None
    second = base.data_ptr() + base.stride(0) * base.element_size()
    if input_ids.data_ptr() != base.data_ptr() or attention_mask.data_ptr() != second:
        return None
    if not (input_ids.is_contiguous() and attention_mask.is_contiguous()):
        return None
    return base


class _CapturedEncoder:
    """The static buffers live and are written in inference mode whatever mode the caller is in
    (an inference tensor cannot be updated in place outside it); the output handed back is a
    clone made in the caller's mode, a normal tensor as colbert-ai returns."""

    def __init__(self, checkpoint, input_ids, attention_mask, mask_form: str, cast_once: bool = False):
        with torch.inference_mode():
            self._capture(checkpoint, input_ids, attention_mask, mask_form, cast_once)

    def _capture(self, checkpoint, input_ids, attention_mask, mask_form: str, cast_once: bool):
        self.weights = _linear_weight_copies(checkpoint, input_ids.device)
        # ids and mask in one buffer when their dtypes allow: the host tokenizer uploads them
        # as the two halves of one tensor, which then arrive here in one copy.
        self.tokens = None
        if input_ids.dtype == attention_mask.dtype:
            self.tokens = torch.stack((input_ids, attention_mask))
            self.input_ids, self.attention_mask = self.tokens[0], self.tokens[1]
        else:
            self.input_ids, self.attention_mask = input_ids.clone(), attention_mask.clone()
        device = input_ids.device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the graph: lazy init, kernel selection
            _encode(checkpoint, self.input_ids, self.attention_mask, mask_form, self.weights, cast_once)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = _encode(checkpoint, self.input_ids, self.attention_mask, mask_form, self.weights,
                               cast_once)

    def __call__(self, input_ids, attention_mask):
        with torch.inference_mode():
            if self.weights is not None:
                self.weights.refresh()
            pair = token_pair(input_ids, attention_mask)
            if self.tokens is not None and pair is not None and pair.shape == self.tokens.shape:
                self.tokens.copy_(pair)
            else:
                self.input_ids.copy_(input_ids)
                self.attention_mask.copy_(attention_mask)
            self.graph.replay()
        return self.out.clone()  # the next replay overwrites self.out


_EAGER_ENCODER = "query encoder ran eagerly: no bit-identical CUDA graph for this input shape"


def _key(checkpoint, input_ids, attention_mask) -> tuple:
    # Parameter storage identifies the weights the graph reads; .to() replaces it.
    first = checkpoint.bert.get_input_embeddings().weight
    last = checkpoint.linear.weight
    return (tuple(input_ids.shape), input_ids.dtype, attention_mask.dtype, input_ids.device,
            first.data_ptr(), last.data_ptr(), last.dtype)


def _capture(original, checkpoint, input_ids, attention_mask):
    """A graph bit-identical to colbert-ai's eager encoder on this input, or None (logged)."""
    expected = original(checkpoint, input_ids, attention_mask)
    reasons = []
    # Each mask form with the self-attention inputs cast once first, then as autocast casts them.
    for form, cast_once in ((form, cast_once) for form in _mask_forms() for cast_once in (True, False)):
        variant = f"{form} mask" + (", q/k/v input cast once" if cast_once else "")
        try:
            captured = _CapturedEncoder(checkpoint, input_ids, attention_mask, form, cast_once=cast_once)
        except Exception as error:  # noqa: BLE001 (any failure means: not this variant)
            reasons.append(f"{variant}: capture failed ({type(error).__name__}: {error})")
            continue
        got = captured(input_ids, attention_mask)
        if got.dtype == expected.dtype and torch.equal(got, expected):
            return captured
        diff = (got.double() - expected.double()).abs().max().item()
        reasons.append(f"{variant}: differs from the eager encoder by {diff:.3g}")
    logger.warning("query encoder runs eagerly for inputs of shape %s: %s",
                   tuple(input_ids.shape), "; ".join(reasons))
    return None


def query(original, checkpoint, *args, to_cpu: bool = False, **kwargs):
    """Stand-in for ``colbert.modeling.checkpoint.Checkpoint.query`` (``original``)."""
    inputs = _graph_inputs(checkpoint, args, kwargs)
    if inputs is None:
        return original(checkpoint, *args, to_cpu=to_cpu, **kwargs)
    input_ids, attention_mask = inputs
    # No padding anywhere (every query of the batch has query_maxlen - 2 or more word pieces,
    # or attend_to_mask_tokens): transformers then drops the mask and SDPA may pick another
    # kernel than the masked one a graph holds, so colbert-ai's own code runs. The host
    # tokenizer (query_tokens) says so on the mask; otherwise one byte is read back.
    has_padding = getattr(attention_mask, query_tokens.HAS_PADDING_ATTRIBUTE, None)
    if has_padding is None:
        has_padding = not bool(attention_mask.all())
    if not has_padding:
        return original(checkpoint, input_ids, attention_mask, to_cpu=to_cpu)
    cache = checkpoint.__dict__.setdefault(_CACHE_ATTRIBUTE, {})
    key = _key(checkpoint, input_ids, attention_mask)
    if key not in cache:
        if len(cache) >= MAX_GRAPHS_PER_CHECKPOINT:
            cache.pop(next(iter(cache)))
        cache[key] = _capture(original, checkpoint, input_ids, attention_mask)
    captured = cache[key]
    if captured is None:
        counters.count_fallback(_EAGER_ENCODER)
        return original(checkpoint, input_ids, attention_mask, to_cpu=to_cpu)
    Q = captured(input_ids, attention_mask)
    return Q.cpu() if to_cpu else Q
