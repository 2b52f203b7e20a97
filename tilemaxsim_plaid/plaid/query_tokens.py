"""colbert-ai's ``QueryTokenizer.tensorize`` for a search's queries, without its device round trips.

Upstream tokenizes with the HF tokenizer (pad and truncate to ``query_maxlen - 1``), uploads the
``BatchEncoding`` to the GPU (``input_ids``, ``token_type_ids`` and ``attention_mask``: three
synchronous copies), then inserts the ``[Q]`` marker column with two ``torch.cat`` and swaps
``[PAD]`` for ``[MASK]`` with a masked fill, all on the device: about ten launches and three
host syncs for 64 integers before the encoder can start.

Here the same tokenizer backend, configured as transformers configures it for upstream's call
(truncation and padding to ``query_maxlen - 1``, the tokenizer's sides and pad token), encodes
the texts on the host; the marker column, the ``[MASK]`` swap and ``attend_to_mask_tokens`` are
applied to the integer lists, and ids and mask travel to the device in one non-blocking copy
from a reused pinned buffer (:class:`PinnedUploads`). The mask is tagged with whether any
position is padded (:data:`HAS_PADDING_ATTRIBUTE`), so the encoder graph need not read it back.
Measured on the H200: results/plaid/h200-host-tokens.

The first call for each (tokenizer, ``query_maxlen``) also runs upstream's ``tensorize`` on the
same texts and on :data:`PROBE_TEXTS` (empty, over-long, special-token strings) and compares:
the host path is used only when every tensor is equal, otherwise upstream's runs from then on and
the reason is logged once. Calls with ``context``, ``bsize`` or ``full_length_search``, and
tokenizers without a Rust backend, always run upstream's code.
"""

from __future__ import annotations

import logging

import torch

from tilemaxsim_plaid.plaid import counters

__all__ = ["HAS_PADDING_ATTRIBUTE", "PROBE_TEXTS", "HostQueryTokenizer", "PinnedUploads", "tensorize"]

logger = logging.getLogger(__name__)

# Set on the returned mask: True when some position is 0 (padding the encoder must mask).
HAS_PADDING_ATTRIBUTE = "_tilemaxsim_has_padding"
_CACHE_ATTRIBUTE = "_tilemaxsim_host_tokenizers"
_UPSTREAM_TOKENS = "query tokens built by colbert-ai's tensorize: the host tokenizer did not match it"

# Checked against upstream before the host path is trusted: truncation (a text far longer than
# any query_maxlen), no word pieces at all, whitespace, special tokens written as text, accents.
PROBE_TEXTS = (
    "",
    "   ",
    "what is the capital of france",
    " ".join(f"word{i} naïve café" for i in range(300)),
    "[CLS] [SEP] [MASK] [PAD] [unused0] tokens written as text",
    "Ünïcødé, punctuation!? and CJK 東京 mixed in",
)


class HostQueryTokenizer:
    """Upstream's tensorize for one ``query_maxlen``, computed on the host (see module doc)."""

    def __init__(self, query_tokenizer, query_maxlen: int):
        import tokenizers

        tok = query_tokenizer.tok
        self.query_maxlen = query_maxlen
        self.marker_id = query_tokenizer.Q_marker_token_id
        self.pad_id = query_tokenizer.pad_token_id
        self.mask_id = query_tokenizer.mask_token_id
        self.attend_to_mask_tokens = bool(query_tokenizer.config.attend_to_mask_tokens)
        # A private copy: the shared backend's truncation/padding state belongs to transformers,
        # which reconfigures it on every call.
        self.backend = tokenizers.Tokenizer.from_str(tok.backend_tokenizer.to_str())
        # What transformers' set_truncation_and_padding sets for upstream's call
        # (padding="max_length", truncation=True, max_length=query_maxlen - 1).
        length = query_maxlen - 1
        self.backend.enable_truncation(max_length=length, stride=0, strategy="longest_first",
                                       direction=tok.truncation_side)
        self.backend.enable_padding(length=length, direction=tok.padding_side, pad_id=tok.pad_token_id,
                                    pad_token=tok.pad_token, pad_type_id=tok.pad_token_type_id)
        self.uploads = PinnedUploads()

    def rows(self, texts) -> tuple[list[list[int]], list[list[int]]]:
        """Token ids and attention mask per text, as upstream's tensors would hold them."""
        encodings = [self.backend.encode(texts[0])] if len(texts) == 1 else self.backend.encode_batch(list(texts))
        ids_rows, mask_rows = [], []
        for encoding in encodings:
            ids, mask = encoding.ids, encoding.attention_mask
            # The [Q] marker goes after [CLS] (upstream's _insert_prefix_token), attended.
            ids = [ids[0], self.marker_id, *ids[1:]]
            mask = [mask[0], 1, *mask[1:]]
            ids = [self.mask_id if token == self.pad_id else token for token in ids]
            if self.attend_to_mask_tokens:
                mask = [1 if token == self.mask_id else m for token, m in zip(ids, mask)]
            ids_rows.append(ids)
            mask_rows.append(mask)
        return ids_rows, mask_rows

    def tensorize(self, texts, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids_rows, mask_rows = self.rows(texts)
        if device.type == "cuda":
            both = self.uploads.upload((ids_rows, mask_rows), device)
        else:
            both = torch.tensor([ids_rows, mask_rows], dtype=torch.int64, device=device)
        ids, mask = both[0], both[1]
        setattr(mask, HAS_PADDING_ATTRIBUTE, any(0 in row for row in mask_rows))
        return ids, mask


class PinnedUploads:
    """Pinned int64 host buffers, per shape, for non-blocking uploads.

    Allocating and pinning a tensor per query costs more host time than encoding its text, so
    each shape keeps up to :attr:`RING` buffers. A buffer is reused only once the CUDA event
    recorded after its last copy has completed (checked with ``Event.query``, which never
    waits). When every buffer is still in flight (a caller encoding query after query without
    reading any result) the copy comes from a fresh pinned tensor of torch's caching host
    allocator, which keeps it until its copy has run, so the host never waits on the GPU's queue.
    """

    RING = 4

    def __init__(self, pin_memory: bool = True, make_event=None):
        self.pin_memory = pin_memory
        self.make_event = torch.cuda.Event if make_event is None else make_event
        self._rings: dict[tuple, list[tuple]] = {}

    def upload(self, rows, device: torch.device) -> torch.Tensor:
        """``torch.tensor(rows, dtype=int64)`` on ``device``, copied from pinned memory."""
        shape = (len(rows), len(rows[0]), len(rows[0][0]))
        ring = self._rings.setdefault(shape, [])
        slot = next((entry for entry in ring if entry[2].query()), None)
        if slot is None and len(ring) < self.RING:
            buffer = torch.empty(shape, dtype=torch.int64, pin_memory=self.pin_memory)
            slot = (buffer, buffer.numpy(), self.make_event())
            ring.append(slot)
        if slot is None:  # every buffer still being copied
            spare = torch.tensor(rows, dtype=torch.int64).pin_memory() if self.pin_memory else torch.tensor(rows)
            return spare.to(device, non_blocking=True, copy=True)
        buffer, array, copied = slot
        array[...] = rows
        out = buffer.to(device, non_blocking=True, copy=True)
        copied.record(torch.cuda.current_stream(device) if device.type == "cuda" else None)
        return out


def _same(expected, got) -> str | None:
    """None when upstream's (ids, mask) equal ours, else what differs."""
    for name, a, b in zip(("input ids", "attention mask"), expected, got):
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or not torch.equal(a, b):
            return f"{name} differ ({tuple(a.shape)} {a.dtype} {a.device} vs {tuple(b.shape)} {b.dtype} {b.device})"
    return None


def _verified(original, query_tokenizer, texts, device) -> HostQueryTokenizer | None:
    """A host tokenizer equal to upstream on ``texts`` and the probes, or None (logged)."""
    maxlen = query_tokenizer.query_maxlen
    try:
        host = HostQueryTokenizer(query_tokenizer, maxlen)
    except Exception as error:  # noqa: BLE001 (no Rust backend, or one that cannot be copied)
        logger.warning("query tokenizer stays upstream's: no host copy (%s: %s)", type(error).__name__, error)
        return None
    for probe in (list(texts), *([text] for text in PROBE_TEXTS)):
        expected = original(query_tokenizer, probe)
        try:
            difference = _same(expected, host.tensorize(probe, device))
        except Exception as error:  # noqa: BLE001 (any failure means: not the host path)
            difference = f"{type(error).__name__}: {error}"
        if difference is not None:
            logger.warning("query tokenizer stays upstream's for query_maxlen=%d: %s on %r",
                           maxlen, difference, probe[0][:60] if probe else probe)
            return None
    return host


def tensorize(original, query_tokenizer, batch_text, bsize=None, context=None, full_length_search=False):
    """Stand-in for ``colbert.modeling.tokenization.QueryTokenizer.tensorize`` (``original``)."""
    if bsize or context is not None or full_length_search or type(batch_text) not in (list, tuple):
        return original(query_tokenizer, batch_text, bsize=bsize, context=context,
                        full_length_search=full_length_search)
    from colbert.modeling.tokenization import query_tokenization

    device = torch.device(query_tokenization.DEVICE)
    hosts = query_tokenizer.__dict__.setdefault(_CACHE_ATTRIBUTE, {})
    key = (query_tokenizer.query_maxlen, bool(query_tokenizer.config.attend_to_mask_tokens))
    if key not in hosts:
        # Upstream runs first, so its one-time printout and `used` flag behave as before.
        result = original(query_tokenizer, batch_text)
        hosts[key] = _verified(original, query_tokenizer, batch_text, device)
        return result
    host = hosts[key]
    if host is None:
        counters.count_fallback(_UPSTREAM_TOKENS)
    if host is None or not batch_text:
        return original(query_tokenizer, batch_text)
    return host.tensorize(batch_text, device)
