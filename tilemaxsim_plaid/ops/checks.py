"""Input checks shared by every host function.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong
contents) with the argument's name, what it got and what was expected. Shape, dtype and device
checks run before any allocation, so such a bad call never launches a kernel.

Checks of values (offsets non-decreasing, ids and lengths in range) read device data, which costs
a host sync. :class:`DataChecks` gathers all of one call's into one small device tensor read back
once, and remembers each tensor's result by identity and version (see :func:`_signature`), so a
tensor passed again unchanged (an index's offsets and codes, a fixed pid list) is not read again;
the threads calling the ops share what is remembered.
The checks a launch does not depend on (a new pid list or query_lengths each call) are read after
the launch instead of before it: the kernel takes the argument clamped into range on the device,
so a bad value cannot reach memory it must not, and the call still raises naming the argument;
the host then waits only for those few check kernels, while the scoring kernel is already queued
behind them, so the GPU does not idle through the launch. Tensors made under
``torch.inference_mode()`` have no version counter: the four scoring ops read their range checks
on every call, after the launch once remembered (``DataChecks(provisional=True)``).

NaN policy (docs/kernels.md, NaN and inf): a NaN in an input reaches exactly the scores it
touches, as NaN, as in torch (every max in the kernels propagates NaN). With ``validate=True``
the residual and PQ ops refuse instead a NaN or inf in their index's small float tensors
(centroids, bucket_weights, inv_norms, codebooks) with a ValueError, checked once per tensor like
the other value checks: one bad entry there touches every document that uses it. Token
embeddings (Q, D, D_packed) and a caller's centroid_scores are not scanned: they are often new
each call (a query, a reranker's gathered candidates), and a scan reads as many bytes as the
scoring itself; there the NaN rule holds.
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref

import torch

from tilemaxsim_plaid.triton_support import interpreting

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


def runs_here(Q: torch.Tensor) -> bool:
    """Whether the kernels run on Q's device: a CUDA GPU, or the CPU in Triton's interpreter."""
    return Q.is_cuda or interpreting()


def check_query(Q) -> None:
    check_tensor("Q", Q, dims=(2, 3), dtypes=FLOAT_DTYPES)
    if Q.shape[-1] == 0:
        raise ValueError(f"Q must have a non-zero embedding dimension, got {describe(Q)}")
    if not runs_here(Q):
        raise ValueError(
            f"Q must be on a CUDA GPU, got {describe(Q)}: the kernels run there (on the CPU only "
            f"in Triton's interpreter, TRITON_INTERPRET=1 set before triton is imported, for "
            f"tests); tilemaxsim_plaid.reference has each op's exact scores on any device")


def check_same_dim(name: str, t: torch.Tensor, Q: torch.Tensor) -> None:
    if t.shape[-1] != Q.shape[-1]:
        raise ValueError(
            f"{name} has embedding dimension {t.shape[-1]} but Q has {Q.shape[-1]} ({describe(t)})"
        )


def check_same_dtype(name: str, t: torch.Tensor, Q: torch.Tensor) -> None:
    if t.dtype != Q.dtype:
        raise TypeError(f"{name} must have Q's dtype {Q.dtype}, got {describe(t)}")


# Tensors whose data checks are remembered, least recently used dropped first: an index's
# document tensors and a few per-batch ones. Each entry holds a weak reference and a few ints.
MAX_CACHED_TENSORS = 64

# (kind, id(tensor)) -> (weak reference, signature, stats)
_cache: collections.OrderedDict = collections.OrderedDict()
# Guards _cache and _derived, which the threads calling the ops share: a hit's move to the
# newest end must not meet another call's eviction of the same entry.
_cache_lock = threading.Lock()


def _recall(cache: collections.OrderedDict, key, t: torch.Tensor, sig):
    """The entry remembered under ``key`` for ``t`` itself with signature ``sig`` (made newest),
    else None (also for ``sig`` None: not remembered)."""
    if sig is None:
        return None
    with _cache_lock:
        entry = cache.get(key)
        if entry is None or entry[0]() is not t or entry[1] != sig:
            return None
        cache.move_to_end(key)
        return entry


def _remember(cache: collections.OrderedDict, key, t: torch.Tensor, sig, value) -> None:
    """``value`` remembered under ``key`` for ``t`` with signature ``sig``, the least recently
    used entries past MAX_CACHED_TENSORS dropped."""
    with _cache_lock:
        cache[key] = (weakref.ref(t), sig, value)
        cache.move_to_end(key)
        while len(cache) > MAX_CACHED_TENSORS:
            cache.popitem(last=False)


# Checks whose failure only loses a refusal: a NaN or inf that slips past them still reaches
# exactly the scores it touches (the NaN policy), so they may be remembered for tensors without
# a version counter; range checks keep what the kernels read inside their tensors.
REFUSALS_ONLY = ("finite",)


INFERENCE = "inference"  # the version of a tensor without a version counter


def _signature(t: torch.Tensor, kind: str, provisional: bool = False):
    """What must be unchanged for a remembered result to hold: the version counter (bumped by
    every in-place write through torch, on any view of the storage), the data pointer, shape,
    strides, dtype and device (a new tensor at a recycled id differs in one of them, and the
    weak reference must still point at the same object). Inference tensors have no version
    counter: None (checked on every call), except for the REFUSALS_ONLY kinds, which are
    remembered by the rest (an index made under ``torch.inference_mode()`` is not scanned for
    NaN on every call; a write into it inside inference mode goes unseen by the refusal), and
    with ``provisional`` (``DataChecks``), where a remembered result is checked again after
    the launch."""
    if t.is_inference():  # asked first: its _version raises a C++ error (results/validate/h200-probe-host-costs)
        if kind not in REFUSALS_ONLY and not provisional:
            return None
        version = INFERENCE
    else:
        version = t._version
    return (version, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


def host_read(t: torch.Tensor) -> list[int]:
    """The one host sync of a call's data checks."""
    return t.tolist()


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
        _derived.clear()


# (what, id(tensor)) -> (weak reference, signature, value): tensors computed from another alone.
_derived: collections.OrderedDict = collections.OrderedDict()


def capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on the current stream of ``t``'s GPU."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def derived(t: torch.Tensor, what, make):
    """``make()``, a tensor computed from ``t`` alone (``what`` names the computation),
    remembered while ``t`` is unchanged (:func:`_signature`), as a check's result is. Made
    again on every call for a tensor without a version counter (made under
    ``torch.inference_mode()``), whose writes cannot be seen, and while a CUDA graph is being
    captured (the graph would hold a tensor the cache may drop, or one its capture never
    computed)."""
    sig = None if capturing(t) else _signature(t, "derived")
    key = (what, id(t))
    entry = _recall(_derived, key, t, sig)
    if entry is not None:
        return entry[2]
    value = make()
    if sig is not None:
        _remember(_derived, key, t, sig, value)
    return value


# Elements per block of kernels/value_range.py (4096 int64 = 32 KB a read), and at most this many
# programs, each walking every RANGE_PROGRAMS-th block and writing its own partial result: two
# per SM of an H200, and at most 2 + 2 * RANGE_PROGRAMS int64 partials per check to merge.
RANGE_BLOCK, RANGE_PROGRAMS = 4096, 264


def _programs(n: int) -> int:
    return min(-(-n // RANGE_BLOCK), RANGE_PROGRAMS)


def _merge(kind: str, values: list[int]) -> list[int]:
    """A range or offsets check's stats from its partials (those of kernels/value_range.py, or
    the stats themselves: one partial); other kinds' stats as they are."""
    if kind == "range":
        return [min(values[0::2]), max(values[1::2])] if values else []
    if kind == "offsets":
        return [values[0], values[1], sum(values[2::2]), max(values[3::2])]
    return values


def _stats_out(size: int, device: torch.device, take=None) -> torch.Tensor:
    """Where a stats kernel writes ``size`` partials: ``take(size)`` (a slice of a pinned
    buffer the host reads with no copy: :class:`_Pending`), else a new device tensor."""
    return take(size) if take is not None else torch.empty(size, dtype=torch.int64, device=device)


def _range_stats(t: torch.Tensor, take=None) -> torch.Tensor:
    """The partials of [min, max] of a non-empty integer tensor, int64 (:func:`_merge`)."""
    if t.is_cuda:
        return _kernel_stats("range", t, None, take)[0]
    lo, hi = torch.aminmax(t)
    return _into(torch.stack([lo, hi]).to(torch.int64), take)


def _offsets_stats(offsets: torch.Tensor, take=None) -> torch.Tensor:
    """The partials of [first, last, number of decreasing steps, longest document]."""
    if offsets.numel() == 1:
        return _into(torch.cat([offsets, offsets, offsets.new_zeros(2)]), take)
    if offsets.is_cuda:
        return _kernel_stats("offsets", offsets, None, take)[0]
    steps = offsets[1:] - offsets[:-1]
    return _into(torch.stack([offsets[0], offsets[-1], (steps < 0).sum(), steps.max()]), take)


# A slot of kernels/value_range.py's _stats_kernel by the check's kind.
_KINDS = {"range": 1, "offsets": 2}


def _kernel_stats(kind: str, t: torch.Tensor, clamp, take=None, slots: list | None = None):
    """(partials, t clamped; t itself with ``clamp`` None) of a "range" check (``clamp``:
    (lo, hi)) or an "offsets" one (int64, 2+ entries, unit stride; ``clamp``: the upper bound)
    by _stats_kernel. Launched here, or with ``slots`` appended to it as one slot of a launch
    made later by :func:`_launch_stats` (the partials and the clamped copy are written then)."""
    flat = t.contiguous().view(-1)  # the kernel reads element i at base + i
    programs = _programs(flat.numel())
    stats = _stats_out(2 * programs + (2 if kind == "offsets" else 0), t.device, take)
    clamped = torch.empty_like(flat) if clamp is not None else flat
    lo, hi = clamp if kind == "range" and clamp is not None else (0, clamp or 0)
    slot = ((flat, stats, clamped, flat.numel(), lo, hi, programs), _KINDS[kind],
            clamp is not None)
    if slots is None:
        _launch_stats([slot])
    else:
        slots.append(slot)
    return stats, (t if clamp is None else clamped.view(t.shape))


def _launch_stats(slots: list) -> None:
    """The checks of ``slots`` (:func:`_kernel_stats`) in one _stats_kernel launch per two."""
    from tilemaxsim_plaid.kernels.value_range import _stats_kernel

    for i in range(0, len(slots), 2):
        (args_a, kind_a, clamp_a), *second = slots[i:i + 2]
        args_b, kind_b, clamp_b = second[0] if second else (args_a, 0, False)
        _stats_kernel[(args_a[-1] + (args_b[-1] if second else 0),)](
            *args_a, *args_b[:-1], BLOCK=RANGE_BLOCK, KIND_A=kind_a, CLAMP_A=clamp_a,
            KIND_B=kind_b, CLAMP_B=clamp_b, WIDE=_wide(max(args_a[3], args_b[3])))


def _wide(n: int) -> bool:
    """Whether _stats_kernel indexes a tensor of ``n`` elements in int64: where a program's
    next block start can pass 2**31 - 1."""
    return n + RANGE_BLOCK * RANGE_PROGRAMS >= 2**31


def _finite_stats(t: torch.Tensor) -> torch.Tensor:
    """[1] if every value is finite, else [0] (min and max propagate NaN; no copy of t)."""
    return torch.isfinite(torch.stack(torch.aminmax(t))).all().reshape(1)


# A check's stats read before the launch: ``t`` -> a tensor of its partials (_merge).
_STATS = {"range": _range_stats, "offsets": _offsets_stats, "finite": _finite_stats}


def _into(stats: torch.Tensor, take) -> torch.Tensor:
    """``stats`` copied into ``take(len)`` where given (behind the work that computed them)."""
    return stats if take is None else take(stats.numel()).copy_(stats, non_blocking=True)


def _range_and_clamp(t: torch.Tensor, bounds: tuple[int, int] | None, take=None, slots=None):
    if t.is_cuda:
        return _kernel_stats("range", t, bounds, take, slots)
    return _range_stats(t, take), (t if bounds is None else t.clamp(*bounds))


def _offsets_and_clamp(offsets: torch.Tensor, bounds: tuple[int, int] | None, take=None,
                       slots=None):
    if offsets.is_cuda and offsets.numel() > 1 and offsets.is_contiguous():
        return _kernel_stats("offsets", offsets, None if bounds is None else bounds[1], take,
                             slots)
    return _offsets_stats(offsets, take), (offsets if bounds is None else offsets.clamp(*bounds))


# The checks a launch may run ahead of (those with bounds): ``(t, bounds, take, slots)`` ->
# (partials, t clamped into bounds; t itself with bounds None), in one pass on the GPU, the
# partials written into ``take(size)`` (:class:`_Pending`); on the GPU, with ``slots``, by a
# launch made later for all of them (:func:`_launch_stats`).
_STATS_AND_CLAMP = {"range": _range_and_clamp, "offsets": _offsets_and_clamp}


class _Pending:
    """Stats on their way to the host, for :meth:`DataChecks.finish`. On the GPU the stats
    kernels write their partials straight into one pinned host buffer (mapped memory: no copy,
    no starting values) handed out by :meth:`take`, and an event recorded behind them marks them
    done: the launch queued after them does not wait for the host, and the host waits for the
    check kernels only. The buffer and the event come from a per-thread pool and go back once
    read, so a call allocates neither (results/PERFORMANCE_LOG.md, runs 124 and 126)."""

    # Partials of one call's deferred checks: at most 2 + 2 * RANGE_PROGRAMS each.
    CAPACITY = 4096

    def __init__(self, device: torch.device):
        self._at = 0
        if device.type == "cuda":
            self._key = torch.cuda.current_device()  # the device its event records on
            free = _pinned_pool().get(self._key)
            self.values, self.event = free.pop() if free else (
                torch.empty(self.CAPACITY, dtype=torch.int64, pin_memory=True), torch.cuda.Event())
        else:
            self.values, self.event = torch.empty(self.CAPACITY, dtype=torch.int64), None

    def take(self, size: int) -> torch.Tensor:
        if self._at + size > self.CAPACITY:
            raise RuntimeError(f"a call's deferred checks need more than {self.CAPACITY} partials")
        self._at += size
        return self.values[self._at - size:self._at]

    def ready(self) -> None:
        """Mark every partial taken so far: the host reads them once the event has passed."""
        if self.event is not None:
            self.event.record()

    def read(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()  # the check kernels only, not the launch queued after them
        values = host_read(self.values[:self._at])
        if self.event is not None:
            _pinned_pool().setdefault(self._key, []).append((self.values, self.event))
        return values


_local = threading.local()


def _pinned_pool() -> dict:
    """This thread's free (pinned buffer, event) pairs by current device. A pair is in use from a
    call's checks to their read, so a thread holds one per call in flight at once."""
    pool = getattr(_local, "pinned", None)
    if pool is None:
        pool = _local.pinned = {}
    return pool


class StaleCheck(Exception):
    """A remembered check of an inference tensor no longer holds (the tensor was written in
    place inside ``torch.inference_mode()``): the launch may have taken the old stats, so
    :func:`rerun_if_stale` makes the call again with the new ones."""


def rerun_if_stale(op):
    """``op`` made again once if its checks find a provisional stat stale (:class:`StaleCheck`);
    the second call reads the new stats remembered by the first."""
    @functools.wraps(op)
    def call(*args, **kwargs):
        try:
            return op(*args, **kwargs)
        except StaleCheck:
            return op(*args, **kwargs)
    return call


class DataChecks:
    """The value checks of one call: :meth:`add` them, then :meth:`run` reads every one not
    remembered from an earlier call in one host sync (none when all are remembered), raises a
    ``ValueError`` naming the argument for the first that fails, and returns each check's stats.

    A check added with ``defer=True`` and ``bounds=(lo, hi)`` is deferred when its tensor is
    new and nothing else must be read before the launch: :meth:`run` queues its stats,
    :meth:`safe` gives the tensor clamped into [lo, hi] for the launch, and :meth:`finish`,
    called after the launch, reads and judges them (still one host sync per call, now behind
    the check kernels instead of before the launch).

    ``provisional=True`` (an op that takes every checked tensor through :meth:`safe` and is
    wrapped in :func:`rerun_if_stale`): a tensor without a version counter (made under
    ``torch.inference_mode()``) whose check is remembered gets its remembered stats for the
    launch, clamped into its bounds (by the kernel with ``launch_clamps``, which takes none of
    the stats: :meth:`add`), and its stats are read again after the launch like a
    deferred check's; if they changed, :meth:`finish` remembers the new ones and raises
    :class:`StaleCheck`, and the call is made again. Without it such checks run before every
    launch."""

    def __init__(self, provisional: bool = False):
        self._items = []
        self._deferred = []  # (name, t, kind, sig, stats) read by finish()
        self._pending = None
        self._safe = {}
        self._provisional = provisional
        self._assumed = {}  # name -> the remembered stats a provisional check lent the launch

    def add(self, name: str, t, kind: str, judge, bounds: tuple[int, int] | None = None,
            defer: bool = False, launch_clamps: bool = False) -> None:
        """``judge(stats)`` raises for bad values; stats are those of ``_STATS[kind]`` (a list
        of ints, empty for an empty range). None tensors are skipped. ``bounds``: the launch is
        safe with ``t`` clamped into [lo, hi]; ``defer``: and it does not need the stats, so a
        new ``t`` is judged after it (see the class docstring). ``launch_clamps``: the kernel
        clamps ``t`` into the bounds as it reads it, so a check judged after the launch reads
        ``t`` and writes no clamped copy (:meth:`safe` gives ``t`` itself)."""
        if t is not None:
            self._items.append((name, t, kind, judge, bounds, defer and bounds is not None,
                                launch_clamps))

    def offsets(self, offsets: torch.Tensor, num_rows: int, name: str = "offsets",
                defer: bool = False, longest: int | None = None) -> None:
        """``offsets`` start at 0 or later, never decrease and end at or before ``num_rows``;
        ``longest``: a caller's bound on every document's length, checked too. ``defer``: a new
        tensor is judged after the launch, which takes it clamped into [0, num_rows] (the
        kernels score a document whose end is before its start as empty, so every read stays
        inside the packed rows)."""
        self.add(name, offsets, "offsets",
                 lambda stats: _judge_offsets(stats, num_rows, name, longest),
                 bounds=(0, num_rows), defer=defer)

    def in_range(self, name: str, t, lo: int, hi: int, what: str | None = None,
                 defer: bool = False, launch_clamps: bool = False) -> None:
        """Every value of ``t`` in [lo, hi) (``what`` names the bound in the message).
        ``defer``: judged after the launch, which takes ``t`` clamped (:meth:`safe`, or the
        kernel itself with ``launch_clamps``: :meth:`add`); an empty range [lo, hi) is judged
        before it."""
        self.add(name, t, "range", lambda stats: _judge_range(stats, name, lo, hi, what),
                 bounds=(lo, hi - 1) if hi > lo else None, defer=defer,
                 launch_clamps=launch_clamps)

    def finite(self, name: str, t) -> None:
        """No NaN or inf anywhere in ``t`` (the NaN policy: module docstring)."""
        def judge(stats):
            if not stats[0]:
                raise ValueError(f"{name} holds NaN or inf values; validate=True refuses "
                                 f"non-finite inputs ({describe(t)})")
        self.add(name, t, "finite", judge)

    def run(self) -> dict[str, list[int]]:
        """Judge every check but the deferred new ones; return the stats found so far."""
        found, missing, queued = {}, [], []
        for name, t, kind, judge, bounds, defer, launch_clamps in self._items:
            sig = _signature(t, kind, self._provisional)
            entry = _recall(_cache, (kind, id(t)), t, sig)
            if entry is not None:
                found[name] = entry[2]
                if sig[0] == INFERENCE and kind not in REFUSALS_ONLY and bounds is not None:
                    if not launch_clamps:  # a kernel that clamps t takes none of its stats
                        self._assumed[name] = entry[2]
                    queued.append((name, t, kind, sig, bounds, launch_clamps))
            elif t.numel() == 0 and kind in ("range", "finite"):
                found[name] = [] if kind == "range" else [1]
            elif t.numel() == 0:
                found[name] = [t.shape[0]]
            elif defer:
                queued.append((name, t, kind, sig, bounds, launch_clamps))
            else:
                missing.append((name, t, kind, sig, _STATS[kind](t)))
        self.found = found
        if (missing or queued) and capturing(self._items[0][1]):
            names = ", ".join(item[0] for item in missing + queued)
            raise RuntimeError(
                f"validate=True must read {names} on the host, which CUDA graph capture does not "
                f"allow: call once with the same tensors before the capture (a checked tensor "
                f"is remembered until it changes; one made under torch.inference_mode() is read "
                f"on every call) or pass validate=False inside it")
        if missing and queued:  # a read before the launch anyway: one read for all
            missing += [(name, t, kind, sig, _STATS[kind](t)) for name, t, kind, sig, *_ in queued]
            queued, self._assumed = [], {}
        if missing:
            _spread(missing, host_read(_flat(missing)), found)
        if queued:
            self._pending = self._queue(queued)
        deferred = {d[0] for d in self._deferred}
        self._judge([item for item in self._items if item[0] not in deferred], missing)
        return found

    def _queue(self, queued) -> "_Pending":
        """Stats of the ``queued`` checks computed now into one :class:`_Pending`, read by
        :meth:`finish`; the launch takes each ``t`` clamped (by the kernel itself with
        ``launch_clamps``)."""
        pending, slots = _Pending(queued[0][1].device), []
        for name, t, kind, sig, bounds, launch_clamps in queued:
            stats, clamped = _STATS_AND_CLAMP[kind](t, None if launch_clamps else bounds,
                                                    pending.take, slots)
            if not launch_clamps:
                self._safe[name] = clamped
            self._deferred.append((name, t, kind, sig, stats))
        _launch_stats(slots)
        pending.ready()
        return pending

    def safe(self, name: str, t):
        """``t`` as the launch may take it: clamped into range while its check is pending."""
        return self._safe.get(name, t)

    def finish(self) -> None:
        """Read and judge the deferred checks; call it after the launch (a no-op when none).
        Raises StaleCheck when a provisional check's stats changed (class docstring)."""
        if self._pending is None:
            return
        deferred, pending, assumed = self._deferred, self._pending, self._assumed
        self._deferred, self._pending, self._safe, self._assumed = [], None, {}, {}
        _spread(deferred, pending.read(), self.found)
        names = {d[0] for d in deferred}
        self._judge([item for item in self._items if item[0] in names], deferred)
        stale = [name for name, stats in assumed.items() if self.found[name] != stats]
        if stale:
            raise StaleCheck(", ".join(stale))

    def _judge(self, items, read) -> None:
        """Judge ``items`` in the order added, so the first bad argument is the one named (a
        judge may read an earlier check's stats from self.found); then remember what was
        ``read`` (all of it passed)."""
        for name, t, kind, judge, *_ in items:
            judge(self.found[name])
        for name, t, kind, sig, _ in read:
            if sig is not None:
                _remember(_cache, (kind, id(t)), t, sig, self.found[name])


def _flat(checks_read) -> torch.Tensor:
    """The stats of (name, t, kind, sig, stats) checks as one int64 tensor."""
    parts = [c[4].reshape(-1).to(torch.int64) for c in checks_read]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _spread(checks_read, values: list[int], found: dict) -> None:
    at = 0
    for name, t, kind, sig, stats in checks_read:
        found[name] = _merge(kind, values[at:at + stats.numel()])
        at += stats.numel()


def _judge_offsets(stats, num_rows: int, name: str, longest: int | None = None) -> None:
    first, last, decreasing, most = stats
    if first < 0:
        raise ValueError(f"{name}[0] must be >= 0, got {first}")
    if decreasing:
        raise ValueError(f"{name} must be non-decreasing ({name}[n+1] >= {name}[n])")
    if last > num_rows:
        raise ValueError(f"{name}[-1] = {last} is past the {num_rows} rows of the packed tensor")
    if longest is not None and most > longest:
        raise ValueError(f"max_doc_len = {longest}, but {name} holds a document of {most} tokens")


def _judge_range(stats, name: str, lo: int, hi: int, what) -> None:
    if stats and (stats[0] < lo or stats[1] >= hi):
        bound = what or f"[{lo}, {hi})"
        raise ValueError(f"{name} must lie in {bound}, got values in [{stats[0]}, {stats[1]}]")


def check_offsets_shape(offsets, device, name: str = "offsets") -> None:
    """offsets: int64 [N+1] on ``device`` (no data read)."""
    check_tensor(name, offsets, dims=(1,), dtypes=(torch.int64,), device=device)
    if offsets.numel() < 1:
        raise ValueError(f"{name} must have N+1 >= 1 entries ({name}[0] = 0)")


def query_lengths_shape(query_lengths, Q: torch.Tensor) -> None:
    """The checks of query_lengths that read no data."""
    if query_lengths is None:
        return
    if Q.dim() != 3:
        raise ValueError("query_lengths needs a 3-D Q [B, Lq, d]; a 2-D Q is one unpadded query")
    check_tensor("query_lengths", query_lengths, dims=(1,), dtypes=INDEX_DTYPES, device=Q.device)
    if query_lengths.numel() != Q.shape[0]:
        raise ValueError(
            f"query_lengths must have B={Q.shape[0]} entries, got {describe(query_lengths)}"
        )


def add_query_lengths(batch: DataChecks, query_lengths, Q: torch.Tensor, defer: bool = False) -> None:
    """query_lengths (shape checked here) in [0, Lq], to be read with ``batch`` (``defer``: see
    :meth:`DataChecks.in_range`)."""
    query_lengths_shape(query_lengths, Q)
    batch.in_range("query_lengths", query_lengths, 0, Q.shape[1] + 1, f"[0, Lq={Q.shape[1]}]",
                   defer=defer)


def lengths_shape(name: str, lengths, count: int, device) -> None:
    if lengths is None:
        return
    check_tensor(name, lengths, dims=(1,), dtypes=INDEX_DTYPES, device=device)
    if lengths.numel() != count:
        raise ValueError(f"{name} must have {count} entries, got {describe(lengths)}")


def pids_shape(pids, device) -> None:
    if pids is not None:
        check_tensor("pids", pids, dims=(1,), dtypes=INDEX_DTYPES, device=device)


def check_query_lengths(query_lengths, Q: torch.Tensor) -> None:
    batch = DataChecks()
    add_query_lengths(batch, query_lengths, Q)
    batch.run()


def check_lengths(name: str, lengths, count: int, limit: int, device) -> None:
    if lengths is None:
        return
    lengths_shape(name, lengths, count, device)
    batch = DataChecks()
    batch.in_range(name, lengths, 0, limit + 1, f"[0, {limit}]")
    batch.run()


def check_offsets(offsets, num_rows: int, device) -> None:
    """offsets: int64 [N+1], starting at 0, non-decreasing, ending at or before num_rows."""
    check_offsets_shape(offsets, device)
    batch = DataChecks()
    batch.offsets(offsets, num_rows)
    batch.run()


def check_pids(pids, num_docs: int, device):
    """pids: int32/int64 [M], every value in [0, num_docs). Returns pids with unit stride (the
    kernels read either index dtype)."""
    if pids is None:
        return None
    pids_shape(pids, device)
    batch = DataChecks()
    batch.in_range("pids", pids, 0, num_docs)
    batch.run()
    return unit_stride(pids)
