"""One compressed index, written in both colbert-ai 0.2.22's and fast-plaid 1.7's on-disk formats.

Comparing two PLAID engines is fair only when both search the same compressed vectors. Both
compress the same way (:func:`tilemaxsim_plaid.codecs.residual.compress_residuals` reproduces
fast-plaid's ``create()`` byte for byte, and colbert-ai's ``ResidualCodec.compress``), so one
pass over a corpus writes one set of centroids, bucket cutoffs and weights, codes and residual
bytes into two folders:

==============================  ==========================================================
colbert-ai (``colbert/``)       fast-plaid (``fast_plaid/``)
==============================  ==========================================================
``centroids.pt`` fp16 [C, d]    ``centroids.npy`` fp16 [C, d]
``buckets.pt`` (cutoffs,        ``bucket_cutoffs.npy``, ``bucket_weights.npy`` fp32;
weights) fp32                   ``avg_residual.npy`` fp32 [d]; ``cluster_threshold.npy``
``avg_residual.pt`` fp32 [d]
``{i}.codes.pt`` int32,         ``merged_codes.npy`` int64 [T + pad],
``{i}.residuals.pt`` uint8      ``merged_residuals.npy`` uint8 [T + pad, d * nbits / 8]
                                (fixed 192-byte npy header, ``pad`` zero rows = longest
                                passage minus the last passage's length) and their
                                ``merged_*.manifest.json`` (every chunk merged)
``doclens.{i}.json``,           ``doclens.{i}.json``, ``{i}.metadata.json``
``{i}.metadata.json``
``ivf.pid.pt`` (int32 pids,     ``ivf.npy`` int64 pids, ``ivf_lengths.npy`` int32
int64 lengths; padded)
``plan.json``, ``metadata.json`` ``plan.json``, ``metadata.json`` (``frozen``, ``mutable``)
==============================  ==========================================================

Both engines load their bucket weights as fp16 on the GPU and decompress as
``normalize(centroid + weight[bucket])``, so the decompressed embeddings are the same too; the
CPU tests check every file against an index fast-plaid itself wrote
(tests/experiments/fixtures/fast_plaid). The centroids come from fast-plaid's own k-means when
fast-plaid is installed (its ``compute_kmeans`` on the sample of passages its ``create()`` would
draw), else from a spherical k-means in torch; the codec follows the rule both engines share
(:func:`tilemaxsim_plaid.codecs.residual.train_bucket_codec`).

Writing streams the corpus chunk by chunk (memory: one chunk plus the IVF's (centroid, pid)
pairs), and a ``visit`` callback sees every chunk's embeddings and codes on the way, which is
where exact scores are computed without a second pass.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from collections.abc import Callable

import numpy as np
import torch

from tilemaxsim_plaid.codecs.residual import compress_residuals, train_bucket_codec
from tilemaxsim_plaid.synthetic import colbert_ivf, ivf_from_pairs, num_partitions_for


__all__ = ["SharedIndex", "write_shared_index", "kmeans_sample_pids", "MERGED_HEADER_LEN"]

# fast-plaid's storage.MERGED_HEADER_LEN: merged files carry a fixed-length npy prologue so that
# fast-plaid can grow them in place.
MERGED_HEADER_LEN = 192
# fast-plaid's create(): at most this many held-out embeddings train the codec (5 % of the sample).
HELDOUT_EMBEDDINGS = 50_000


def kmeans_sample_pids(num_passages: int, seed: int) -> np.ndarray:
    """The passages fast-plaid's ``compute_kmeans`` samples: ``1 + 16 sqrt(120 N)`` of them (at
    most N), by ``torch.randperm`` under a generator seeded with ``seed``."""
    count = min(1 + int(16 * math.sqrt(120 * num_passages)), num_passages)
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_passages, generator=generator)[:count].numpy()


class SharedIndex:
    """Paths and facts of a written shared index (``root/colbert``, ``root/fast_plaid``)."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.colbert = self.root / "colbert"
        self.fast_plaid = self.root / "fast_plaid"
        self.manifest_path = self.root / "shared_index.json"

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text())

    def complete(self, spec_key: dict) -> bool:
        return (self.manifest_path.exists() and self.manifest.get("complete")
                and self.manifest.get("key") == spec_key)


def _npy_header(dtype: np.dtype, shape: tuple[int, ...], total: int | None = None) -> bytes:
    """An npy v1.0 prologue; ``total`` pads it to that many bytes (fast-plaid's merged files),
    else to a multiple of 16 with Rust-style shape tuples (tch's ``write_npy``)."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    if total is not None:
        shape_text = f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"
    else:
        descr = "<" + np.dtype(dtype).kind + str(np.dtype(dtype).itemsize)
        shape_text = "(" + ",".join(map(str, shape)) + ",)"
    body = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}"
    length = total if total is not None else ((10 + len(body) + 1 + 15) // 16) * 16
    header = (body + " " * (length - 10 - len(body) - 1) + "\n").encode("ascii")
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def _write_npy(path: pathlib.Path, array: np.ndarray) -> None:
    """A small array as tch's ``write_npy`` writes it (fast-plaid's Rust side reads these)."""
    array = np.ascontiguousarray(array)
    with open(path, "wb") as f:
        f.write(_npy_header(array.dtype, array.shape))
        f.write(array.tobytes())


def _open_merged(path: pathlib.Path, dtype, shape: tuple[int, ...]) -> np.memmap:
    row_bytes = int(np.dtype(dtype).itemsize * np.prod(shape[1:], dtype=np.int64))
    with open(path, "wb") as f:
        f.write(_npy_header(dtype, shape, total=MERGED_HEADER_LEN))
        f.truncate(MERGED_HEADER_LEN + shape[0] * row_bytes)
    return np.memmap(path, dtype=dtype, mode="r+", offset=MERGED_HEADER_LEN, shape=shape)


def _colbert_config(corpus, nbits: int, path: pathlib.Path) -> dict:
    from colbert.infra.config import ColBERTConfig

    config = ColBERTConfig(dim=corpus.dim, nbits=nbits, doc_maxlen=corpus.doc_maxlen,
                           query_maxlen=corpus.query_maxlen, index_name=path.name,
                           index_root=str(path.parent), experiment="engines", nranks=1,
                           avoid_fork_if_possible=True)
    exported = config.export()
    exported["collection"] = [f"list with {corpus.num_passages} elements starting with...",
                              [f"passage {pid}" for pid in range(min(3, corpus.num_passages))]]
    return exported


def _centroids(corpus, num_centroids: int, seed: int, kmeans_iters: int, device,
               log: Callable[[str], None] = print) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(centroids fp16 [C, d], heldout fp16 [<=50k, d], how)`` from fast-plaid's sample:
    fast-plaid's own k-means on a GPU where it imports, else a torch one (logged on a GPU)."""
    sample = kmeans_sample_pids(corpus.num_passages, seed)
    chunk_of = sample // corpus.chunk_passages
    parts = []
    for index in np.unique(chunk_of):
        E = corpus.chunk(int(index))
        offsets = corpus.chunk_offsets(int(index)).cpu().numpy()
        local = np.sort(sample[chunk_of == index]) - int(index) * corpus.chunk_passages
        rows = np.concatenate([np.arange(offsets[p], offsets[p + 1]) for p in local])
        parts.append(E[torch.from_numpy(rows).to(E.device)].cpu())
    tokens = torch.cat(parts)
    heldout = tokens[-min(HELDOUT_EMBEDDINGS, max(1, tokens.shape[0] // 20)):]
    on_gpu = torch.device(device).type == "cuda"
    try:
        from fast_plaid.search.fast_plaid import compute_kmeans
    except ImportError as err:
        compute_kmeans = None
        if on_gpu:
            log(f"fast-plaid's compute_kmeans cannot be imported ({err}); torch k-means instead")
    if compute_kmeans is not None and on_gpu:
        centroids = compute_kmeans(documents_embeddings=[tokens], dim=tokens.shape[1],
                                   device=str(torch.device(device)), kmeans_niters=kmeans_iters,
                                   max_points_per_centroid=256, seed=seed, n_samples_kmeans=1,
                                   num_partitions=num_centroids)
        return centroids.half(), heldout, "fast-plaid compute_kmeans"
    return _spherical_kmeans(tokens, num_centroids, kmeans_iters, seed, device), heldout, "torch k-means"


# Similarities of the torch k-means held at once (fp32): its assignment runs over blocks of rows.
KMEANS_BLOCK_BYTES = 1 << 30


def _spherical_kmeans(tokens: torch.Tensor, k: int, iters: int, seed: int, device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    X = tokens.to(device=device, dtype=torch.float32)
    k = min(k, X.shape[0])
    centroids = X[torch.randperm(X.shape[0], generator=generator)[:k].to(X.device)].clone()
    rows = max(1, KMEANS_BLOCK_BYTES // (4 * max(1, k)))
    for _ in range(iters):
        assign = torch.cat([(block @ centroids.T).argmax(1) for block in X.split(rows)])
        sums = torch.zeros_like(centroids).index_add_(0, assign, X)
        counts = torch.bincount(assign, minlength=k)
        centroids = torch.where(counts[:, None] > 0, sums, centroids)
        centroids = torch.nn.functional.normalize(centroids, dim=-1)
    return centroids.half()


def write_shared_index(corpus, root, *, nbits: int = 2, num_centroids: int | None = None,
                       seed: int = 42, kmeans_iters: int = 4, codec: dict | None = None,
                       visit: Callable[[int, int, torch.Tensor, torch.Tensor, torch.Tensor, dict], None] | None = None,
                       log: Callable[[str], None] = print) -> dict:
    """Compress ``corpus`` once and write it for colbert-ai and fast-plaid under ``root``.

    Args:
        corpus: an :class:`~.engine_corpus.Corpus` or :class:`~.engine_corpus.EmbeddingList`
            (chunks come on ``corpus.device``, where compression runs too).
        root: folder to write (``colbert/``, ``fast_plaid/`` and ``shared_index.json``).
        nbits: residual bits per dimension (1, 2 or 4).
        num_centroids: C; None applies both engines' rule to the corpus's embedding count.
        seed: the k-means seed (fast-plaid's ``create()`` default is 42).
        kmeans_iters: k-means iterations (fast-plaid's default is 4).
        codec: a given codec instead of k-means and training: ``centroids`` fp16 [C, d],
            ``bucket_cutoffs``, ``bucket_weights``, ``avg_residual``, ``cluster_threshold``
            (e.g. read from an index fast-plaid wrote).
        visit: called per chunk as ``visit(chunk, first_pid, embeddings, codes, residuals,
            codec)`` with the chunk's fp16 embeddings and its codes (int64) and residual bytes.
        log: progress lines.

    Returns:
        The manifest (also in ``shared_index.json``): sizes, codec origin, seconds per phase.
    """
    index = SharedIndex(root)
    index.colbert.mkdir(parents=True, exist_ok=True)
    index.fast_plaid.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    T, N, d = corpus.num_embeddings, corpus.num_passages, corpus.dim
    if codec is None:
        C = num_centroids or num_partitions_for(T)  # colbert-ai's rule, which fast-plaid shares
        centroids, heldout, how = _centroids(corpus, C, seed, kmeans_iters, corpus.device, log)
        codec = train_bucket_codec(heldout.to(corpus.device), centroids.to(corpus.device), nbits)
        codec["centroids"] = centroids.cpu()
    else:
        codec = {name: torch.as_tensor(value).cpu() for name, value in codec.items()}
        centroids, how = codec["centroids"].half(), "given"
    C = centroids.shape[0]
    kmeans_s = time.perf_counter() - started
    log(f"engine index: {N:,} passages, {T:,} embeddings, C={C:,} ({how}), k-means and codec "
        f"{kmeans_s:.1f} s")

    fp, cb = index.fast_plaid, index.colbert
    torch.save(codec["centroids"], cb / "centroids.pt")
    torch.save((codec["bucket_cutoffs"], codec["bucket_weights"]), cb / "buckets.pt")
    torch.save(codec["avg_residual"], cb / "avg_residual.pt")
    _write_npy(fp / "centroids.npy", codec["centroids"].numpy())
    for name in ("avg_residual", "bucket_cutoffs", "bucket_weights", "cluster_threshold"):
        _write_npy(fp / f"{name}.npy", codec[name].float().numpy())

    width = d * nbits // 8
    pad = int(corpus.doclens.max() - corpus.doclens[-1])
    merged_codes = _open_merged(fp / "merged_codes.npy", np.int64, (T + pad,))
    merged_residuals = _open_merged(fp / "merged_residuals.npy", np.uint8, (T + pad, width))
    merged_codes[T:] = 0
    merged_residuals[T:] = 0
    device_centroids = centroids.to(corpus.device)
    cutoffs = codec["bucket_cutoffs"].to(corpus.device)
    pair_codes, pair_pids, manifest_rows = [], [], []
    chunks = list(corpus.chunk_ranges())
    for chunk, first, end in chunks:
        E = corpus.chunk(chunk)
        codes, residuals = compress_residuals(E, device_centroids, cutoffs, nbits)
        if visit is not None:
            visit(chunk, first, E, codes, residuals, codec)
        lengths = corpus.doclens[first:end]
        rows = int(lengths.sum())
        offset = int(corpus.offsets[first])
        codes_cpu, residuals_cpu = codes.cpu(), residuals.cpu()
        merged_codes[offset:offset + rows] = codes_cpu.numpy()
        merged_residuals[offset:offset + rows] = residuals_cpu.numpy()
        torch.save(codes_cpu.to(torch.int32), cb / f"{chunk}.codes.pt")
        torch.save(residuals_cpu, cb / f"{chunk}.residuals.pt")
        doclens_text = json.dumps([int(x) for x in lengths], separators=(",", ":"))
        for folder in (cb, fp):
            (folder / f"doclens.{chunk}.json").write_text(doclens_text)
        (cb / f"{chunk}.metadata.json").write_text(json.dumps(
            {"passage_offset": first, "num_passages": end - first, "num_embeddings": rows,
             "embedding_offset": offset}, indent=4) + "\n")
        (fp / f"{chunk}.metadata.json").write_text(json.dumps(
            {"embedding_offset": offset, "num_documents": end - first, "num_embeddings": rows}, indent=2))
        token_pids = torch.repeat_interleave(torch.arange(first, end, device=codes.device),
                                             torch.from_numpy(lengths).to(codes.device))
        keys = torch.unique(codes * N + token_pids)
        pair_codes.append((keys // N).to(torch.int32).cpu().numpy())
        pair_pids.append((keys % N).to(torch.int32).cpu().numpy())
        manifest_rows.append(rows)
        if chunk % 40 == 0 or chunk == len(chunks) - 1:
            log(f"engine index: chunk {chunk + 1}/{len(chunks)} "
                f"({time.perf_counter() - started:.0f} s)")
    merged_codes.flush()
    merged_residuals.flush()
    del merged_codes, merged_residuals
    compress_s = time.perf_counter() - started - kmeans_s

    ivf, lengths = ivf_from_pairs(pair_codes, pair_pids, C)
    _write_npy(fp / "ivf.npy", ivf.astype(np.int64))
    _write_npy(fp / "ivf_lengths.npy", lengths.astype(np.int32))
    torch.save(colbert_ivf(ivf, lengths), cb / "ivf.pid.pt")

    for suffix in ("codes", "residuals"):
        (fp / f"merged_{suffix}.manifest.json").write_text(json.dumps(
            {f"{i}.{suffix}.npy": {"rows": rows, "merged": True, "mtime": None}
             for i, rows in enumerate(manifest_rows)}))
    (fp / "plan.json").write_text(json.dumps({"nbits": nbits, "num_chunks": len(chunks)}, indent=2) + "\n")
    (fp / "metadata.json").write_text(json.dumps(
        {"avg_doclen": T / N, "compress_only": False, "nbits": nbits, "num_chunks": len(chunks),
         "num_documents": N, "num_embeddings": T, "num_partitions": C, "frozen": True,
         "mutable": True}, indent=2))
    config = _colbert_config(corpus, nbits, cb)
    (cb / "plan.json").write_text(json.dumps(
        {"config": config, "num_chunks": len(chunks), "num_partitions": C,
         "num_embeddings_est": float(T), "avg_doclen_est": T / N}, indent=4) + "\n")
    (cb / "metadata.json").write_text(json.dumps(
        {"config": config, "num_chunks": len(chunks), "num_partitions": C, "num_embeddings": T,
         "avg_doclen": T / N}, indent=4) + "\n")
    manifest = {"key": {"corpus": corpus.key(), "nbits": nbits, "num_centroids": C, "seed": seed,
                        "kmeans_iters": kmeans_iters},
                "complete": True, "num_passages": N, "num_embeddings": T, "num_centroids": C,
                "nbits": nbits, "centroids_from": how, "ivf_pairs": int(ivf.shape[0]),
                "seconds": {"kmeans_and_codec": kmeans_s, "compress_and_write": compress_s,
                            "total": time.perf_counter() - started}}
    index.manifest_path.write_text(json.dumps(manifest, indent=2))
    return manifest
