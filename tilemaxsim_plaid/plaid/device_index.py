"""A PLAID index held on the scoring device, once per colbert-ai IndexScorer.

colbert-ai keeps codes, residuals and the IVF in CPU memory even in GPU mode, so every query
gathers on the host, copies to the GPU and synchronises. :func:`device_index` copies them to
the device once and caches the copy on the IndexScorer; the cache is keyed by the identity
and shape of the source tensors, so an index reloaded or changed in place (a new
``embeddings`` or ``codec`` object) is copied again on the next query.
"""

from __future__ import annotations

import dataclasses

import torch

from tilemaxsim_plaid.plaid.environment import backend_for

__all__ = ["DeviceIndex", "SHARDED_INDEX_ATTRIBUTE", "device_index", "scoring_device"]

_CACHE_ATTRIBUTE = "_tilemaxsim_device_index"
# An IndexScorer carrying a sharded index under this attribute scores stage 4 through it (see
# tilemaxsim_plaid.distributed.plaid_search): its residuals live in the shards, so the device copy
# here keeps only what stages 1-3 read (codes, IVF, centroids), not every rank's full residuals.
SHARDED_INDEX_ATTRIBUTE = "_tilemaxsim_sharded_index"


@dataclasses.dataclass(frozen=True)
class DeviceIndex:
    """The parts of a PLAID index that scoring reads, all on ``device``.

    Attributes:
        device: where every tensor lives.
        codes: [T] int32 centroid id per token (colbert-ai's 512 padding rows dropped).
        residuals: [T, dim * nbits / 8] uint8 packed residual buckets ([0, ...] when the scorer
            is sharded: stage 4 then reads each rank's own shard).
        offsets: [N+1] int64, document n owns tokens ``offsets[n]:offsets[n+1]``.
        doclens: [N] int64 tokens per document.
        centroids: [C, dim] fp32 (colbert-ai stores fp16; the fp32 copy is exact).
        bucket_weights: [2**nbits] fp32 residual value per bucket.
        bucket_table: [256, 8 / nbits] uint8 bucket index of each field of a residual byte
            (``decompression_lookup_table[reversed_bit_map]``: one gather instead of two).
        ivf_pids: [E] int32 documents of every centroid's inverted list, concatenated.
        ivf_offsets: [C+1] int64 list boundaries; ivf_lengths: [C] int64.
        dim, nbits, num_docs, num_tokens: ints.
        max_doclen: longest document (host int: sizes padded buffers without a sync).
        max_ivf_length: longest inverted list (host int, same reason).
        ivf_lengths_desc_cumsum: [C] host int64, cumulative sum of the list lengths sorted
            descending: bounds the candidates of ``n`` probed lists without a sync.
        source_key: identity of the host tensors this copy was made from.
        inv_norms: [T] fp32 inverse norm of every decompressed token, or None. Precomputed
            for the Triton backend, whose residual kernel then skips normalising each token.
        bucket_weights_in_fp16: every bucket weight is an fp16 value (always so for colbert-ai's
            GPU codec, which holds them in fp16): fp16 tensor-core products then read them
            exactly (``backends.products_for``).
        centroids_half: [C, dim] fp16 copy of ``centroids`` when every entry is an fp16 value
            (colbert-ai saves them in fp16), else None; Triton backend only. A rerank builds
            its centroid table from it on fp16 tensor cores
            (``ops.residual.split_query_centroid_scores``), reading half the bytes of the fp32
            copy. 16 MB for C = 65,536 at d = 128.
    """

    device: torch.device
    codes: torch.Tensor
    residuals: torch.Tensor
    offsets: torch.Tensor
    doclens: torch.Tensor
    centroids: torch.Tensor
    bucket_weights: torch.Tensor
    bucket_table: torch.Tensor
    ivf_pids: torch.Tensor
    ivf_offsets: torch.Tensor
    ivf_lengths: torch.Tensor
    dim: int
    nbits: int
    num_docs: int
    num_tokens: int
    max_doclen: int
    max_ivf_length: int
    ivf_lengths_desc_cumsum: torch.Tensor
    source_key: tuple
    inv_norms: torch.Tensor | None = None
    bucket_weights_in_fp16: bool = False
    centroids_half: torch.Tensor | None = None

    def candidate_capacity(self, num_lists: int) -> int:
        """Most distinct documents that ``num_lists`` probed inverted lists can hold."""
        if num_lists <= 0 or self.ivf_lengths_desc_cumsum.numel() == 0:
            return 0
        bound = int(self.ivf_lengths_desc_cumsum[min(num_lists, self.ivf_lengths_desc_cumsum.numel()) - 1])
        return max(1, min(self.num_docs, bound))


def scoring_device(scorer) -> torch.device:
    """The device colbert-ai would score on: the current CUDA device in GPU mode, else CPU."""
    if scorer.use_gpu:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _source_key(scorer, device: torch.device) -> tuple:
    def ident(t):  # read on every query: plain attribute reads, no conversions
        return (id(t), t.data_ptr(), t.shape, t.dtype) if isinstance(t, torch.Tensor) else id(t)

    codec, embeddings = scorer.codec, scorer.embeddings
    return (
        str(device),
        backend_for(device),  # the Triton backend also keeps per-token inverse norms
        hasattr(scorer, SHARDED_INDEX_ATTRIBUTE),  # sharded: no residuals in this copy
        ident(embeddings.codes),
        ident(embeddings.residuals),
        ident(scorer.doclens),
        ident(codec.centroids),
        ident(codec.bucket_weights),
        ident(scorer.ivf.tensor),
        ident(scorer.ivf.lengths),
    )


def _build(scorer, device: torch.device, key: tuple) -> DeviceIndex:
    codec, embeddings = scorer.codec, scorer.embeddings
    doclens = scorer.doclens.to(torch.int64)
    offsets = torch.zeros(doclens.numel() + 1, dtype=torch.int64)
    torch.cumsum(doclens, 0, out=offsets[1:])
    num_tokens = int(offsets[-1])
    ivf_lengths = scorer.ivf.lengths.to(torch.int64)
    ivf_offsets = torch.zeros(ivf_lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(ivf_lengths, 0, out=ivf_offsets[1:])
    num_entries = int(ivf_offsets[-1])
    sharded = hasattr(scorer, SHARDED_INDEX_ATTRIBUTE)
    residuals = embeddings.residuals[: 0 if sharded else num_tokens]
    reversed_bit_map = codec.reversed_bit_map.cpu().long()
    bucket_table = codec.decompression_lookup_table.cpu()[reversed_bit_map]
    weights = codec.bucket_weights.detach().to(device="cpu", dtype=torch.float32)
    return DeviceIndex(
        device=device,
        codes=embeddings.codes[:num_tokens].to(device=device, dtype=torch.int32).contiguous(),
        residuals=residuals.to(device).contiguous(),
        offsets=offsets.to(device),
        doclens=doclens.to(device),
        centroids=codec.centroids.to(device=device, dtype=torch.float32).contiguous(),
        bucket_weights=weights.to(device).contiguous(),
        bucket_weights_in_fp16=bool(torch.equal(weights.half().float(), weights)),
        bucket_table=bucket_table.to(device).contiguous(),
        ivf_pids=scorer.ivf.tensor[:num_entries].to(device=device, dtype=torch.int32).contiguous(),
        ivf_offsets=ivf_offsets.to(device),
        ivf_lengths=ivf_lengths.to(device),
        dim=int(codec.dim),
        nbits=int(codec.nbits),
        num_docs=int(doclens.numel()),
        num_tokens=num_tokens,
        max_doclen=int(doclens.max()) if doclens.numel() else 0,
        max_ivf_length=int(ivf_lengths.max()) if ivf_lengths.numel() else 0,
        ivf_lengths_desc_cumsum=torch.sort(ivf_lengths, descending=True).values.cumsum(0),
        source_key=key,
    )


def _with_kernel_extras(index: DeviceIndex) -> DeviceIndex:
    """What the Triton backend's residual kernel reads besides the index: per-token inverse
    norms, and the centroids in fp16 where that copy is exact."""
    if backend_for(index.device) != "triton" or index.residuals.shape[0] != index.num_tokens:
        return index  # the torch backend normalises as it decodes; a sharded copy has no residuals
    from tilemaxsim_plaid.codecs.residual import residual_inverse_norms

    inv_norms = residual_inverse_norms(index.codes, index.residuals, index.centroids,
                                       index.bucket_weights, index.nbits)
    half = index.centroids.half()
    exact_half = bool(torch.equal(half.float(), index.centroids))  # one sync, at index load
    return dataclasses.replace(index, inv_norms=inv_norms,
                               centroids_half=half if exact_half else None)


def device_index(scorer, device: torch.device | None = None) -> DeviceIndex:
    """The device copy of ``scorer``'s index, built on first use and whenever it changed.

    Args:
        scorer: a colbert-ai ``IndexScorer``.
        device: default :func:`scoring_device`.

    Returns:
        The cached :class:`DeviceIndex`.
    """
    device = scoring_device(scorer) if device is None else torch.device(device)
    key = _source_key(scorer, device)
    cached = scorer.__dict__.get(_CACHE_ATTRIBUTE)
    if cached is not None and cached.source_key == key:
        return cached
    # rank() runs under torch.inference_mode(); tensors made there could not be used by a
    # later call outside it (e.g. score_pids from user code), so the copy is made outside.
    with torch.inference_mode(False), torch.no_grad():
        built = _build(scorer, device, key)
        built = _with_kernel_extras(built)
    scorer.__dict__[_CACHE_ATTRIBUTE] = built
    return built
