"""Input checks shared by every host function.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong
contents) with the argument's name, what it got and what was expected. They run before any
allocation so a bad call never launches a kernel.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def unit_stride(t):
    """``t`` with its elements adjacent, as the kernels index 1-D tensors (element i at base + i):
    ``t`` itself when it already is (no copy on the usual path), else one contiguous copy, so a
    strided view (a column of a 2-D tensor) scores like the contiguous tensor. None stays None."""
    return t if t is None or t.is_contiguous() else t.contiguous()


def describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(name: str, t, *, dims: tuple[int, ...], dtypes=None, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in dims:
        want = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{name} must be {want}, got {describe(t)}")
    if dtypes is not None and t.dtype not in dtypes:
        want = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({want}), got {describe(t)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (where Q is), got {describe(t)}")


def check_query(Q) -> None:
    check_tensor("Q", Q, dims=(2, 3), dtypes=FLOAT_DTYPES)
    if Q.shape[-1] == 0:
        raise ValueError(f"Q must have a non-zero embedding dimension, got {describe(Q)}")


def check_same_dim(name: str, t: torch.Tensor, Q: torch.Tensor) -> None:
    if t.shape[-1] != Q.shape[-1]:
        raise ValueError(
            f"{name} has embedding dimension {t.shape[-1]} but Q has {Q.shape[-1]} ({describe(t)})"
        )


def check_same_dtype(name: str, t: torch.Tensor, Q: torch.Tensor) -> None:
    if t.dtype != Q.dtype:
        raise TypeError(f"{name} must have Q's dtype {Q.dtype}, got {describe(t)}")


def check_query_lengths(query_lengths, Q: torch.Tensor) -> None:
    if query_lengths is None:
        return
    if Q.dim() != 3:
        raise ValueError("query_lengths needs a 3-D Q [B, Lq, d]; a 2-D Q is one unpadded query")
    check_tensor("query_lengths", query_lengths, dims=(1,), dtypes=INDEX_DTYPES, device=Q.device)
    if query_lengths.numel() != Q.shape[0]:
        raise ValueError(
            f"query_lengths must have B={Q.shape[0]} entries, got {describe(query_lengths)}"
        )
    if query_lengths.numel() and (
        int(query_lengths.min()) < 0 or int(query_lengths.max()) > Q.shape[1]
    ):
        raise ValueError(f"query_lengths must lie in [0, Lq={Q.shape[1]}]")


def check_lengths(name: str, lengths, count: int, limit: int, device) -> None:
    if lengths is None:
        return
    check_tensor(name, lengths, dims=(1,), dtypes=INDEX_DTYPES, device=device)
    if lengths.numel() != count:
        raise ValueError(f"{name} must have {count} entries, got {describe(lengths)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > limit):
        raise ValueError(f"{name} must lie in [0, {limit}]")


def check_offsets(offsets, num_rows: int, device) -> None:
    """offsets: int64 [N+1], starting at 0, non-decreasing, ending at or before num_rows."""
    check_tensor("offsets", offsets, dims=(1,), dtypes=(torch.int64,), device=device)
    if offsets.numel() < 1:
        raise ValueError("offsets must have N+1 >= 1 entries (offsets[0] = 0)")
    if int(offsets[0]) < 0:
        raise ValueError(f"offsets[0] must be >= 0, got {int(offsets[0])}")
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError("offsets must be non-decreasing (offsets[n+1] >= offsets[n])")
    if int(offsets[-1]) > num_rows:
        raise ValueError(
            f"offsets[-1] = {int(offsets[-1])} is past the {num_rows} rows of the packed tensor"
        )


def check_pids(pids, num_docs: int, device):
    """pids: int32/int64 [M], every value in [0, num_docs). Returns an int64 contiguous copy."""
    if pids is None:
        return None
    check_tensor("pids", pids, dims=(1,), dtypes=INDEX_DTYPES, device=device)
    if pids.numel() and (int(pids.min()) < 0 or int(pids.max()) >= num_docs):
        raise ValueError(
            f"pids must lie in [0, {num_docs}), got values in [{int(pids.min())}, {int(pids.max())}]"
        )
    return pids.to(torch.int64).contiguous()
