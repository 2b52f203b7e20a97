"""validate=True: every value check of a public op, one host sync per call for what is new and
none for tensors checked before unchanged (ops/checks.py DataChecks). Kernels are stubbed out:
these tests are about the host side; exactness is tests/kernels/."""

from __future__ import annotations

import collections
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import ON_GPU
from tests.kernels.test_maxsim_pq import random_pq_index
from tests.kernels.test_maxsim_residual import NUM_CENTROIDS, random_index, unit_queries
from tilemaxsim_plaid.ops import checks, dense, pq, residual

LENGTHS = [3, 5, 1, 4]
B, LQ = 2, 8


@pytest.fixture(autouse=True)
def fresh_cache():
    checks.clear_cache()
    yield
    checks.clear_cache()


@pytest.fixture
def stub_kernels(monkeypatch):
    """Each op's launch returns zeros of the output's shape: no kernel runs."""
    def zeros(Q3, num_out):
        return torch.zeros(Q3.shape[0], num_out, device=Q3.device)

    monkeypatch.setattr(dense, "_launch", lambda Q3, D, **kw: zeros(Q3, kw["num_out_docs"]))
    monkeypatch.setattr(residual, "_launch", lambda Q3, *args: zeros(Q3, args[9]))
    monkeypatch.setattr(pq, "_launch", lambda Q3, *args: zeros(Q3, args[8]))


class SyncCounter(TorchDispatchMode):
    """Counts the reads of device values by the host: checks.host_read (one tensor read back
    whole) and aten._local_scalar_dense (int(t), bool(t), t.item())."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.reads = 0
        real = checks.host_read

        def counted(t):
            self.reads += 1
            return real(t)

        monkeypatch.setattr(checks, "host_read", counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _offsets(lengths, device):
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths).cumsum(0)
    return offsets.to(device)


def make(op, device):
    """(call(tensors, **kwargs), tensors): tensors holds every argument by name."""
    q16 = lambda dim: torch.randn(B, LQ, dim).to(torch.float16).to(device)  # noqa: E731
    common = dict(pids=torch.tensor([3, 0, 2], device=device),
                  query_lengths=torch.tensor([LQ, 3], device=device))
    if op == "packed":
        offsets = _offsets(LENGTHS, device)
        t = dict(Q=q16(64), D=torch.randn(sum(LENGTHS), 64).half().to(device), offsets=offsets,
                 **common)
        return (lambda t, **kw: dense.maxsim_packed(t["Q"], t["D"], t["offsets"], t["pids"],
                                                    query_lengths=t["query_lengths"], **kw)), t
    if op == "padded":
        t = dict(Q=q16(64), D=torch.randn(4, 6, 64).half().to(device),
                 doc_lengths=torch.tensor([6, 0, 2, 5], device=device),
                 query_lengths=common["query_lengths"])
        return (lambda t, **kw: dense.maxsim_padded(t["Q"], t["D"], t["doc_lengths"],
                                                    t["query_lengths"], **kw)), t
    if op == "residual":
        t = dict(random_index(device, 128, 2, lengths=LENGTHS), Q=unit_queries(B, LQ, 128,
                                                                                torch.float16,
                                                                                device), **common)
        return (lambda t, **kw: residual.maxsim_residual(
            t["Q"], t["codes"], t["residuals"], t["offsets"], t["centroids"], t["bucket_weights"],
            2, t["pids"], query_lengths=t["query_lengths"], **kw)), t
    assert op == "pq"
    index = {k: v.to(device) for k, v in random_pq_index(device, 64, 16, lengths=LENGTHS,
                                                          num_centroids=8).items()}
    t = dict(index, Q=q16(64), **common)
    return (lambda t, **kw: pq.maxsim_pq(
        t["Q"], t["pq_codes"], t["offsets"], t["codebooks"], t["pids"],
        centroid_codes=t["centroid_codes"], centroids=t["centroids"], inv_norms=t["inv_norms"],
        query_lengths=t["query_lengths"], **kw)), t


OPS = ("packed", "padded", "residual", "pq")


def _set(t, i, value):
    t = t.clone()
    t[i] = value
    return t


# (ops, argument, bad value from the good tensors)
BAD = [
    (("packed", "residual", "pq"), "offsets", lambda t: _set(t["offsets"], 2, 1)),  # decreasing
    (("packed", "residual", "pq"), "offsets", lambda t: _set(t["offsets"], 0, -1)),
    (("packed", "residual", "pq"), "offsets", lambda t: _set(t["offsets"], -1, 99)),  # past T
    (("packed", "residual", "pq"), "pids", lambda t: _set(t["pids"], 1, len(LENGTHS))),
    (("packed", "residual", "pq"), "pids", lambda t: _set(t["pids"], 1, -1)),
    (OPS, "query_lengths", lambda t: _set(t["query_lengths"], 1, LQ + 1)),
    (OPS, "query_lengths", lambda t: _set(t["query_lengths"], 0, -1)),
    (("padded",), "doc_lengths", lambda t: _set(t["doc_lengths"], 3, 7)),
    (("padded",), "doc_lengths", lambda t: _set(t["doc_lengths"], 3, -1)),
    (("residual",), "codes", lambda t: _set(t["codes"], 4, NUM_CENTROIDS)),
    (("residual",), "codes", lambda t: _set(t["codes"], 4, -1)),
    (("pq",), "centroid_codes", lambda t: _set(t["centroid_codes"], 4, 8)),
]
BAD_CASES = [pytest.param(op, name, bad, id=f"{op}-{name}-{i}")
             for i, (ops, name, bad) in enumerate(BAD) for op in ops]


@pytest.mark.parametrize("op,name,bad", BAD_CASES)
def test_bad_values_raise_naming_the_argument(device, stub_kernels, op, name, bad):
    call, t = make(op, device)
    call(t)  # the good tensors pass (and are remembered)
    with pytest.raises(ValueError, match=name):
        call(dict(t, **{name: bad(t)}))  # a new tensor at the same shape is read
    call(t)


@pytest.mark.parametrize("op,name,bad", BAD_CASES)
def test_in_place_change_is_checked_again(device, stub_kernels, op, name, bad):
    """A remembered tensor written in place (its version bumps) is read again, also when the
    write goes through another view of its storage."""
    call, t = make(op, device)
    call(t)
    t[name].copy_(bad(t))
    with pytest.raises(ValueError, match=name):
        call(t)
    t = make(op, device)[1]
    base = torch.stack([t[name], t[name]])
    t[name] = base[0]
    call(t)
    base[0].copy_(bad(t))  # another view: the version counter is the storage's
    with pytest.raises(ValueError, match=name):
        call(t)


@pytest.mark.parametrize("op", OPS)
def test_one_sync_per_call_and_none_for_unchanged_tensors(device, stub_kernels, monkeypatch, op):
    call, t = make(op, device)
    with SyncCounter(monkeypatch) as counter:
        call(t)
        assert counter.reads == 1  # every check of the call in one read
        call(t)
        call(t)
        assert counter.reads == 1  # all remembered: no read
        call(dict(t, query_lengths=t["query_lengths"].clone()))
        assert counter.reads == 2  # only the new tensor is read
        call(t, validate=False)
        assert counter.reads == 2


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("validate", [True, False])
def test_a_query_off_the_gpu_is_refused_outside_the_interpreter(monkeypatch, op, validate):
    """CPU tensors without TRITON_INTERPRET=1: a ValueError naming Q and where the kernels run
    (not triton's driver error from the launch), before anything is read or launched."""
    monkeypatch.setattr(checks, "interpreting", lambda: False)
    call, t = make(op, torch.device("cpu"))
    with SyncCounter(monkeypatch) as counter, \
            pytest.raises(ValueError, match="Q must be on a CUDA GPU"):
        call(t, validate=validate)
    assert counter.reads == 0


@pytest.mark.parametrize("op", OPS)
def test_validate_false_reads_nothing(device, stub_kernels, monkeypatch, op):
    call, t = make(op, device)
    with SyncCounter(monkeypatch) as counter:
        call(t, validate=False)
    assert counter.reads == 0


def test_remembered_stats_judged_against_each_call(device, stub_kernels):
    """A cached pid list is judged again against the documents of each call (no read)."""
    call, t = make("packed", device)
    call(t)
    with pytest.raises(ValueError, match="pids"):
        call(dict(t, offsets=t["offsets"][:3]))  # two documents: pid 3 is out of range


def test_inference_tensors_are_checked_every_call(device, stub_kernels, monkeypatch):
    """Inference tensors have no version counter: their range checks are read on every call
    (after the launch once remembered: test_inference_index_is_checked_after_the_launch)."""
    with torch.inference_mode():
        call, t = make("packed", device)
    with SyncCounter(monkeypatch) as counter:
        call(t)
        call(t)
    assert counter.reads == 2


@pytest.mark.parametrize("op", OPS)
def test_inference_index_is_checked_after_the_launch(device, launch_log, op):
    """An index made under inference_mode: the first call reads its checks before the launch
    (the padded op's can all wait for it); later calls launch on the remembered stats, the index
    tensors clamped into their bounds, and read the checks after it."""
    with torch.inference_mode():
        call, t = make(op, device)
    call(t)
    assert [e[0] for e in launch_log] == (["launch", "read"] if op == "padded" else
                                          ["read", "launch"])
    launch_log.clear()
    call(t)
    assert [e[0] for e in launch_log] == ["launch", "read"]


def _inference_packed(device):
    """An inference-mode packed index of 40 rows whose offsets use the first 13."""
    with torch.inference_mode():
        D = torch.randn(40, 64).half().to(device)
        offsets = torch.tensor([0, 3, 8, 9, 13], device=device)
        Q = torch.randn(B, LQ, 64).half().to(device)
    return Q, D, offsets


def test_inference_offsets_written_in_place_are_judged(device, launch_log):
    Q, D, offsets = _inference_packed(device)
    dense.maxsim_packed(Q, D, offsets)
    with torch.inference_mode():
        offsets[2] = 1  # decreasing, in place: no version counter sees it
    launch_log.clear()
    with pytest.raises(ValueError, match="offsets must be non-decreasing"):
        dense.maxsim_packed(Q, D, offsets)
    assert [e[0] for e in launch_log] == ["launch", "read"]


def test_inference_offsets_written_in_place_score_as_the_new_ones(device, monkeypatch):
    """The real kernels: a longer last document (31 rows, past the remembered longest, 5) makes
    the call run again on the new stats, and it scores as validate=False told the new length."""
    launches = []
    real = dense._launch
    monkeypatch.setattr(dense, "_launch", lambda *a, **kw: (launches.append(kw["max_doc_len"]),
                                                            real(*a, **kw))[1])
    Q, D, offsets = _inference_packed(device)
    dense.maxsim_packed(Q, D, offsets)
    with torch.inference_mode():
        offsets[-1] = 40
    launches.clear()
    got = dense.maxsim_packed(Q, D, offsets)
    assert launches == [5, 31]  # the remembered longest, then the new one
    want = dense.maxsim_packed(Q, D, offsets.clone(), max_doc_len=31, validate=False)
    assert torch.equal(got, want)
    from tilemaxsim_plaid import reference
    ref = reference.maxsim_packed(Q.cpu(), D.cpu(), offsets.cpu())
    assert torch.allclose(got.cpu().double(), ref, rtol=2e-3, atol=2e-3)
    launches.clear()
    dense.maxsim_packed(Q, D, offsets)
    assert launches == [31]  # the new stats are remembered


def test_inference_tensors_are_scanned_for_nan_once(device, stub_kernels, monkeypatch):
    """The NaN refusal of an inference tensor is remembered (a NaN that slipped past it would
    still reach its scores); its range checks are not."""
    with torch.inference_mode():
        call, t = make("pq", device)
    t["pids"] = t["query_lengths"] = None
    counts = {"finite": 0, "offsets": 0}
    for stats, kind in ((checks._STATS, "finite"), (checks._STATS, "offsets"),
                        (checks._STATS_AND_CLAMP, "offsets")):  # read before / after a launch
        real = stats[kind]
        monkeypatch.setitem(stats, kind, (lambda real, kind: lambda *x: (
            counts.__setitem__(kind, counts[kind] + 1), real(*x))[1])(real, kind))
    call(t)
    first = dict(counts)
    call(t)
    assert first["finite"] >= 1 and first["offsets"] == 1
    assert counts == dict(first, offsets=2)  # the float tensors once; the offsets each call


@pytest.mark.skipif(not ON_GPU, reason="the stats kernels serve GPU tensors")
def test_inference_index_checks_share_one_stats_launch(device, stub_kernels, monkeypatch):
    """A residual index made under inference mode has its offsets and codes checked on every
    call: in one stats launch, read back once."""
    from tilemaxsim_plaid.kernels import value_range

    with torch.inference_mode():
        call, t = make("residual", device)
    t["pids"] = t["query_lengths"] = None
    call(t)  # the first call reads every check before its launch
    grids, real = [], value_range._stats_kernel

    class Counting:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(value_range, "_stats_kernel", Counting())
    reads = []
    real_read = checks.host_read
    monkeypatch.setattr(checks, "host_read", lambda x: (reads.append(1), real_read(x))[1])
    call(t)
    call(t)
    assert len(grids) == 2 and len(reads) == 2


def test_cache_is_bounded_and_holds_no_tensor(device):
    tensors = [torch.arange(4, device=device) for _ in range(checks.MAX_CACHED_TENSORS + 10)]
    for x in tensors:
        checks.check_pids(x, 4, x.device)
    assert len(checks._cache) == checks.MAX_CACHED_TENSORS
    probe = torch.arange(4, device=device)
    checks.check_pids(probe, 4, probe.device)
    ref = checks._cache[("range", id(probe))][0]
    del probe
    assert ref() is None  # a weak reference: the cache keeps no tensor alive


def test_a_remembered_check_outlives_another_threads_clear(device, stub_kernels, monkeypatch):
    """Threads calling the ops share the check cache: a call that finds its offsets remembered
    makes the entry newest while another thread drops it (an eviction, or clear_cache), without
    a KeyError. The cache pauses that call between its lookup and the move for as long as the
    other thread needs to clear it, unless the cache is locked against it."""
    call, t = make("packed", device)
    want = call(t)
    lookup, cleared = threading.Event(), threading.Event()

    class PausedAtLookup(collections.OrderedDict):
        def get(self, key, default=None):
            entry = super().get(key, default)
            if key[0] == "offsets" and not lookup.is_set():
                lookup.set()
                cleared.wait(timeout=0.2)  # the clear runs now where nothing keeps it out
            return entry

    monkeypatch.setattr(checks, "_cache", PausedAtLookup(checks._cache))

    def other_thread():
        lookup.wait(timeout=5)
        checks.clear_cache()
        cleared.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        got = call(t)
    finally:
        thread.join()
    assert lookup.is_set() and cleared.is_set()
    torch.testing.assert_close(got, want)


def test_recycled_id_is_not_trusted(device):
    """A remembered entry whose weak reference is dead (the id reused by a new tensor) is read
    again, even with the same shape and version."""
    good = torch.arange(4, device=device)
    checks.check_pids(good, 4, good.device)
    key = ("range", id(good))
    entry = checks._cache.pop(key)
    bad = torch.tensor([0, 1, 2, 9], device=device)
    checks._cache[("range", id(bad))] = entry  # as if bad had been born at good's id
    with pytest.raises(ValueError, match="pids"):
        checks.check_pids(bad, 4, bad.device)


@pytest.mark.parametrize("op", OPS)
def test_checks_that_must_read_refuse_graph_capture_naming_them(device, stub_kernels,
                                                               monkeypatch, op):
    """Inside CUDA graph capture a host read is not allowed: remembered tensors pass, a new one
    raises naming it and what to do, before anything is read."""
    call, t = make(op, device)
    call(t)
    monkeypatch.setattr(checks, "capturing", lambda t: True)
    call(t)  # everything remembered: nothing to read
    with SyncCounter(monkeypatch) as counter:
        with pytest.raises(RuntimeError, match="query_lengths.*validate=False"):
            call(dict(t, query_lengths=t["query_lengths"].clone()))
    assert counter.reads == 0
    call(dict(t, query_lengths=t["query_lengths"].clone()), validate=False)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs")
def test_a_checked_call_captured_after_a_first_call_replays_its_scores(device):
    """The real kernels: validate=True inside capture with tensors checked before it records
    the launch alone; a new pid list inside capture raises naming pids."""
    from tests.conftest import replayed_from_cuda_graph

    call, t = make("packed", device)
    want = call(t)
    torch.cuda.synchronize()
    assert torch.equal(replayed_from_cuda_graph(lambda: call(t)), want)
    with pytest.raises(RuntimeError, match="pids"):
        replayed_from_cuda_graph(lambda: call(dict(t, pids=t["pids"].clone())))


def _no_sync_after_first_call(call, tensors, *renewed):
    """The first call, then two more with each of ``renewed`` a new copy, none of which may
    synchronise with the GPU."""
    call(tensors)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            call(dict(tensors, **{name: tensors[name].clone() for name in renewed}))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not ON_GPU, reason="host syncs are a GPU matter")
@pytest.mark.parametrize("op", OPS)
def test_no_device_sync_for_remembered_tensors_on_gpu(device, op):
    _no_sync_after_first_call(*make(op, device))


@pytest.mark.skipif(not ON_GPU, reason="host syncs are a GPU matter")
@pytest.mark.parametrize("op", ["packed", "padded"])
def test_no_device_sync_for_new_documents_on_gpu(device, op):
    """A reranker's documents, new each call, are not read by validate=True."""
    _no_sync_after_first_call(*make(op, device), "D")


# NaN policy (docs/kernels.md): validate=True refuses NaN or inf in an index's small float
# tensors; token embeddings and a caller's centroid_scores are not scanned.
FLOAT_INPUTS = [("residual", "centroids"), ("residual", "bucket_weights"),
                ("residual", "inv_norms"), ("pq", "codebooks"), ("pq", "centroids"),
                ("pq", "inv_norms")]


def _poison(x, value):
    x = x.clone()
    x.view(-1)[x.numel() // 2] = value
    return x


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")],
                         ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("op,name", FLOAT_INPUTS, ids=[f"{o}-{n}" for o, n in FLOAT_INPUTS])
def test_non_finite_index_tensors_are_refused(device, stub_kernels, op, name, value):
    call, t = make(op, device)
    if name == "inv_norms" and op == "residual":
        t["inv_norms"] = torch.ones(t["codes"].shape[0], device=device)
        call = (lambda c: lambda t, **kw: c(t, inv_norms=t["inv_norms"], **kw))(call)
    call(t)
    with pytest.raises(ValueError, match=name):
        call(dict(t, **{name: _poison(t[name], value)}))
    t[name].copy_(_poison(t[name], value))  # in place: checked again
    with pytest.raises(ValueError, match=name):
        call(t)
    call(dict(t, **{name: _poison(t[name], 0.5)}), validate=False)  # not read without validate


TOKEN_INPUTS = [("packed", "D"), ("padded", "D"), ("residual", "centroid_scores")]


@pytest.mark.parametrize("op,name", TOKEN_INPUTS, ids=[f"{o}-{n}" for o, n in TOKEN_INPUTS])
def test_token_embeddings_are_not_scanned(device, stub_kernels, monkeypatch, op, name):
    """D, D_packed and a caller's centroid_scores are new each call in a reranker's use: with
    validate=True a NaN there is not refused (it reaches exactly its scores: test below and
    tests/kernels/test_nan_policy.py) and a new one costs no read of its values."""
    call, t = make(op, device)
    if name == "centroid_scores":
        inv_norms = torch.ones(t["codes"].shape[0], device=device)
        t[name] = torch.zeros(NUM_CENTROIDS, B * LQ, device=device)
        call = (lambda c: lambda t, **kw: c(t, inv_norms=inv_norms,
                                            centroid_scores=t["centroid_scores"], **kw))(call)
    call(t)  # the index's own checks, remembered
    with SyncCounter(monkeypatch) as counter:
        for _ in range(3):
            call(dict(t, **{name: _poison(t[name], float("nan"))}))
    assert counter.reads == 0


@pytest.mark.parametrize("op", ["packed", "padded"])
def test_nan_in_a_document_reaches_its_scores(device, op):
    """With validate=True a NaN in a document token that is read makes exactly that document's
    scores NaN; one in a row no document reads (PLAID keeps uninitialised rows past
    offsets[-1], padding past a document's length) changes nothing."""
    call, t = make(op, device)
    t = dict(t, pids=None, query_lengths=None)
    want = call(t, validate=False)
    D = t["D"].clone()
    if op == "packed":
        unread = torch.full((3, D.shape[1]), float("nan"), dtype=D.dtype, device=device)
        torch.testing.assert_close(call(dict(t, D=torch.cat([D, unread]))), want)
        D[LENGTHS[0] + 1, 5] = float("nan")  # a token of document 1
    else:
        D[1, 3, 5] = float("nan")  # past document 1's length (0): not read
        torch.testing.assert_close(call(dict(t, D=D)), want)
        D[2, 1, 5] = float("nan")  # a token of document 2
    got = call(dict(t, D=D))
    hit = 1 if op == "packed" else 2
    assert torch.isnan(got[:, hit]).all()
    others = [n for n in range(got.shape[1]) if n != hit]
    torch.testing.assert_close(got[:, others], want[:, others])


@pytest.mark.parametrize("op", OPS)
def test_nan_in_the_query_reaches_its_scores(device, op):
    """validate=True does not read Q (a host sync per call): a NaN there reaches exactly the
    scores of its query (the NaN policy, docs/kernels.md); tests/kernels/test_nan_policy.py
    checks every input of every op against the reference."""
    call, t = make(op, device)
    t["Q"] = t["Q"].clone()
    t["Q"][0, 1, 3] = float("nan")
    # No empty document (an empty document scores -inf whatever the query).
    out = call(dict(t, pids=None, query_lengths=None, doc_lengths=None))
    assert not torch.isnan(out[1]).any()
    assert torch.isnan(out[0]).all()


# A new pid list, query_lengths or doc_lengths each call, everything else remembered: judged
# after the launch (which takes them clamped into range), so the GPU does not idle through it.
PER_CALL_NAMES = ("pids", "query_lengths", "doc_lengths")
PER_CALL = [pytest.param(op, name, bad, id=f"{op}-{name}-{i}")
            for i, (ops, name, bad) in enumerate(BAD) if name in PER_CALL_NAMES for op in ops]


@pytest.fixture
def launch_log(monkeypatch):
    """Stubbed launches that log ("launch", the pids, query_lengths and doc_lengths they were
    given); host reads log ("read",)."""
    log = []
    real = checks.host_read

    def read(t):
        log.append(("read",))
        return real(t)

    def launched(Q3, num_out, pids, query_lengths, doc_lengths=None):
        log.append(("launch", pids, query_lengths, doc_lengths))
        return torch.zeros(Q3.shape[0], num_out, device=Q3.device)

    monkeypatch.setattr(checks, "host_read", read)
    monkeypatch.setattr(dense, "_launch", lambda Q3, D, **kw: launched(
        Q3, kw["num_out_docs"], kw["pids"], kw["query_lengths"], kw["doc_lengths"]))
    monkeypatch.setattr(residual, "_launch", lambda Q3, *a: launched(Q3, a[9], a[6], a[8]))
    monkeypatch.setattr(pq, "_launch", lambda Q3, *a: launched(Q3, a[8], a[3], a[7]))
    return log


@pytest.mark.parametrize("op", OPS)
def test_new_per_call_tensors_are_read_after_the_launch(device, launch_log, op):
    call, t = make(op, device)
    call(t)
    # A new index is read before the launch; the padded op has nothing that must be.
    assert [e[0] for e in launch_log] == (["launch", "read"] if op == "padded" else
                                          ["read", "launch"])
    launch_log.clear()
    call(dict(t, **{name: t[name].clone() for name in PER_CALL_NAMES if name in t}))
    assert [e[0] for e in launch_log] == ["launch", "read"]
    launch_log.clear()
    call(t)
    assert [e[0] for e in launch_log] == ["launch"]


@pytest.mark.parametrize("op,name,bad", PER_CALL)
def test_bad_per_call_tensors_raise_after_a_clamped_launch(device, launch_log, op, name, bad):
    call, t = make(op, device)
    call(t)
    launch_log.clear()
    with pytest.raises(ValueError, match=name):
        call(dict(t, **{name: bad(t)}))
    assert [e[0] for e in launch_log] == ["launch", "read"]
    given = launch_log[0][1 + PER_CALL_NAMES.index(name)]
    hi = (len(LENGTHS) - 1 if name == "pids" else LQ if name == "query_lengths"
          else t["D"].shape[1])
    assert 0 <= int(given.min()) and int(given.max()) <= hi  # the kernel never saw the bad value
    call(t)  # the bad tensor was not remembered; the good ones still are


def test_per_call_read_joins_a_read_before_the_launch(device, launch_log):
    """When something must be read before the launch anyway (a new offsets tensor), the new pids
    are read with it: one read per call, before the launch, and the launch gets pids as given."""
    call, t = make("packed", device)
    call(t)
    launch_log.clear()
    pids = t["pids"].clone()
    call(dict(t, offsets=t["offsets"].clone(), pids=pids))
    assert [e[0] for e in launch_log] == ["read", "launch"]
    assert launch_log[1][1] is pids


def _one_query_or_a_bound(t, way):
    """The packed call's tensors and keywords for a launch that takes none of the offsets'
    stats: one query (2-D Q), or several with max_doc_len given."""
    if way == "one query":
        return dict(t, Q=t["Q"][0], query_lengths=None), {}
    return t, {"max_doc_len": max(LENGTHS)}


@pytest.mark.parametrize("way", ["one query", "max_doc_len"])
def test_new_offsets_are_read_after_a_launch_that_takes_none_of_their_stats(device, monkeypatch,
                                                                            way):
    """A reranker's batch (new D_packed and offsets each call): for one query, or with
    max_doc_len given, the offsets are judged after the launch, which takes them clamped into
    the rows; a bad one still raises naming offsets, and a max_doc_len below the longest
    document raises naming it (after the launch for new offsets, before it for remembered)."""
    log = []
    real = checks.host_read

    def read(x):
        log.append(("read",))
        return real(x)

    def launched(Q3, D, **kw):
        log.append(("launch", kw["offsets"]))
        return torch.zeros(Q3.shape[0], kw["num_out_docs"], device=Q3.device)

    monkeypatch.setattr(checks, "host_read", read)
    monkeypatch.setattr(dense, "_launch", launched)
    call, t = make("packed", device)
    t, kw = _one_query_or_a_bound(t, way)
    call(t, **kw)
    log.clear()
    call(dict(t, D=t["D"].clone(), offsets=t["offsets"].clone()), **kw)
    assert [e[0] for e in log] == ["launch", "read"]
    for bad in (_set(t["offsets"], 2, 1), _set(t["offsets"], -1, 99), _set(t["offsets"], 0, -1)):
        log.clear()
        with pytest.raises(ValueError, match="offsets"):
            call(dict(t, offsets=bad), **kw)
        assert [e[0] for e in log] == ["launch", "read"]
        given = log[0][1]
        assert int(given.min()) >= 0 and int(given.max()) <= t["D"].shape[0]
    log.clear()
    with pytest.raises(ValueError, match="max_doc_len"):
        call(dict(t, offsets=t["offsets"].clone()), max_doc_len=max(LENGTHS) - 1)
    assert [e[0] for e in log] == ["launch", "read"]
    log.clear()
    with pytest.raises(ValueError, match="max_doc_len"):
        call(t, max_doc_len=max(LENGTHS) - 1)  # remembered offsets: judged before the launch
    assert log == []


def test_new_residual_offsets_are_read_after_a_launch_that_took_them_clamped(device,
                                                                            residual_codes_log):
    """The residual op's launch takes none of the offsets' statistics: a new offsets (with new
    codes, a new packed batch) is judged after it; a bad one raises naming offsets."""
    call, t = make("residual", device)
    call(t)
    residual_codes_log.clear()
    call(dict(t, offsets=t["offsets"].clone(), codes=t["codes"].clone()))
    assert [e[0] for e in residual_codes_log] == ["launch", "read"]
    for bad in (_set(t["offsets"], 2, 1), _set(t["offsets"], -1, 99)):
        residual_codes_log.clear()
        with pytest.raises(ValueError, match="offsets"):
            call(dict(t, offsets=bad))
        assert [e[0] for e in residual_codes_log] == ["launch", "read"]
        given = residual_codes_log[0][2]
        assert int(given.min()) >= 0 and int(given.max()) <= t["codes"].shape[0]


def test_a_single_tile_config_reads_new_offsets_before_its_launch(device, stub_kernels,
                                                                   monkeypatch):
    """One query with config.single_tile: the launch needs the longest document, so a new
    offsets is read before it (and the config's bound is checked against it)."""
    call, t = make("packed", device)
    t = dict(t, Q=t["Q"][0], query_lengths=None)
    config = dense.MaxSimConfig(block_t=8, single_tile=True)
    seen = []
    monkeypatch.setattr(dense, "_launch", lambda Q3, D, **kw: (
        seen.append(kw["max_doc_len"]), torch.zeros(1, kw["num_out_docs"], device=Q3.device))[1])
    call(dict(t, offsets=t["offsets"].clone()), config=config)
    assert seen == [max(LENGTHS)]


@pytest.mark.parametrize("way", ["one query", "max_doc_len"])
def test_new_offsets_judged_after_the_launch_score_as_remembered_ones(device, way):
    """The real kernels: a new offsets each call (a column view too) scores as the remembered
    one; out-of-order offsets raise naming offsets."""
    call, t = make("packed", device)
    t, kw = _one_query_or_a_bound(t, way)
    want = call(t, **kw)
    offsets = t["offsets"]
    for new in (offsets.clone(), torch.stack([offsets, torch.full_like(offsets, -7)], 1)[:, 0]):
        assert torch.equal(call(dict(t, offsets=new), **kw), want)
    with pytest.raises(ValueError, match="offsets"):
        call(dict(t, offsets=_set(offsets, 2, 1)), **kw)
    assert torch.equal(call(dict(t, offsets=offsets.clone()), **kw), want)


@pytest.mark.parametrize("op", ("packed", "residual", "pq"))
def test_deferred_checks_score_as_validate_false(device, op):
    """The real kernels: a new pid list checked after the launch scores exactly as a remembered
    one, and a bad one raises without reading out of range."""
    call, t = make(op, device)
    pids = torch.tensor([2, 3, 0, 1, 3], device=device)
    call(dict(t, pids=pids))  # the index and pids are remembered
    want = call(dict(t, pids=pids))
    assert torch.equal(call(dict(t, pids=pids.clone())), want)
    strided = torch.stack([pids, torch.full_like(pids, 1 << 40)], 1)[:, 0]  # a column view
    assert torch.equal(call(dict(t, pids=strided)), want)
    with pytest.raises(ValueError, match="pids"):
        call(dict(t, pids=torch.tensor([2, 3, 1 << 40, 1], device=device)))
    assert torch.equal(call(dict(t, pids=pids.clone())), want)


def test_new_doc_lengths_score_as_remembered_ones(device):
    """The real kernels: new doc_lengths each call, judged after the launch, score as the
    remembered tensor (whose longest document picks the tiling: equal up to fp32 rounding), a
    column view too; a length past D's rows raises naming doc_lengths."""
    call, t = make("padded", device)
    want = call(t)
    lengths = t["doc_lengths"]
    for new in (lengths.clone(), torch.stack([lengths, torch.full_like(lengths, 99)], 1)[:, 0]):
        torch.testing.assert_close(call(dict(t, doc_lengths=new)), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="doc_lengths"):
        call(dict(t, doc_lengths=_set(lengths, 0, t["D"].shape[1] + 1)))


@pytest.mark.parametrize("op", ("packed", "residual", "pq"))
def test_inference_index_of_strided_views_scores_as_when_first_read(device, op):
    """The real kernels: an inference-mode index whose 1-D tensors are column views scores the
    same on the remembered (clamped, rechecked) call as on the first, read before the launch."""
    def column(x):
        return torch.stack([x, torch.full_like(x, 7)], 1)[:, 0]

    with torch.inference_mode():
        call, t = make(op, device)
        for name in ("offsets", "codes", "centroid_codes"):
            if name in t:
                t[name] = column(t[name])
    first = call(t)
    assert torch.equal(call(t), first)
    # validate=False without max_doc_len may take another tiling: equal up to fp32 rounding.
    torch.testing.assert_close(call(t, validate=False), first, rtol=1e-5, atol=1e-5)


def _launch_log(monkeypatch, module, logged, num_out):
    """Stub ``module._launch`` to log ("launch", *its arguments at positions ``logged``) and
    return zeros [B, its argument at ``num_out``]; host reads log ("read",)."""
    log = []
    real = checks.host_read
    monkeypatch.setattr(checks, "host_read", lambda t: (log.append(("read",)), real(t))[1])
    monkeypatch.setattr(module, "_launch", lambda Q3, *a: (
        log.append(("launch", *(a[i] for i in logged))),
        torch.zeros(Q3.shape[0], a[num_out], device=Q3.device))[1])
    return log


@pytest.fixture
def residual_codes_log(monkeypatch):
    """Stubbed residual launches that log ("launch", the codes and offsets they were given)."""
    return _launch_log(monkeypatch, residual, (0, 2), 9)


def test_new_codes_are_judged_after_a_launch_that_clamps_them(device, residual_codes_log):
    """The residual kernel clamps codes as it reads them: a new codes tensor is read after the
    launch, which gets it as given (no clamped copy), and a bad one still raises."""
    call, t = make("residual", device)
    call(t)
    residual_codes_log.clear()
    codes = t["codes"].clone()
    call(dict(t, codes=codes))
    assert [e[0] for e in residual_codes_log] == ["launch", "read"]
    assert residual_codes_log[0][1] is codes
    residual_codes_log.clear()
    with pytest.raises(ValueError, match="codes"):
        call(dict(t, codes=_set(codes, 4, NUM_CENTROIDS)))
    assert [e[0] for e in residual_codes_log] == ["launch", "read"]


def test_inference_codes_are_read_again_but_not_copied(device, residual_codes_log):
    """An inference-mode residual index: the remembered call launches on codes as they are,
    reads their check after the launch, and an in-place write inside the range needs no second
    launch (the kernel took none of the codes' stats); one outside it raises."""
    with torch.inference_mode():
        call, t = make("residual", device)
    call(t)
    residual_codes_log.clear()
    call(t)
    assert [e[0] for e in residual_codes_log] == ["launch", "read"]
    assert residual_codes_log[0][1] is t["codes"]
    with torch.inference_mode():
        t["codes"][0] = NUM_CENTROIDS - 1 - t["codes"][0]
    residual_codes_log.clear()
    call(t)
    assert [e[0] for e in residual_codes_log] == ["launch", "read"]
    with torch.inference_mode():
        t["codes"][3] = NUM_CENTROIDS + 2
    residual_codes_log.clear()
    with pytest.raises(ValueError, match="codes"):
        call(t)
    assert [e[0] for e in residual_codes_log] == ["launch", "read"]


@pytest.fixture
def pq_launch_log(monkeypatch):
    """Stubbed PQ launches that log ("launch", the offsets and centroid_codes they were given)."""
    return _launch_log(monkeypatch, pq, (1, 4), 8)


def test_new_pq_offsets_and_centroid_codes_are_read_after_a_launch_that_took_them_clamped(
        device, pq_launch_log):
    """The PQ op's launch takes none of their statistics: a new offsets and centroid_codes (a
    new packed batch) are judged after it, which got them clamped; a bad one raises naming it."""
    call, t = make("pq", device)
    call(t)
    pq_launch_log.clear()
    call(dict(t, offsets=t["offsets"].clone(), centroid_codes=t["centroid_codes"].clone()))
    assert [e[0] for e in pq_launch_log] == ["launch", "read"]
    num_tokens, num_centroids = t["pq_codes"].shape[0], t["centroids"].shape[0]
    for name, bad in (("offsets", _set(t["offsets"], 2, 1)),
                      ("offsets", _set(t["offsets"], -1, 99)),
                      ("offsets", _set(t["offsets"], 0, -1)),
                      ("centroid_codes", _set(t["centroid_codes"], 4, num_centroids)),
                      ("centroid_codes", _set(t["centroid_codes"], 4, -1))):
        pq_launch_log.clear()
        with pytest.raises(ValueError, match=name):
            call(dict(t, **{name: bad}))
        assert [e[0] for e in pq_launch_log] == ["launch", "read"]
        offsets, centroid_codes = pq_launch_log[0][1:]
        assert int(offsets.min()) >= 0 and int(offsets.max()) <= num_tokens
        assert int(centroid_codes.min()) >= 0 and int(centroid_codes.max()) < num_centroids


def test_new_pq_offsets_score_as_remembered_ones(device):
    """The real kernels: a new offsets and centroid_codes each call (column views too) score as
    the remembered ones; out-of-order offsets raise naming offsets."""
    call, t = make("pq", device)
    want = call(t)

    def column(x):
        return torch.stack([x, torch.full_like(x, -7)], 1)[:, 0]

    for new in ((lambda x: x.clone()), column):
        got = call(dict(t, offsets=new(t["offsets"]), centroid_codes=new(t["centroid_codes"])))
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="offsets"):
        call(dict(t, offsets=_set(t["offsets"], 2, 1)))
    assert torch.equal(call(dict(t, offsets=t["offsets"].clone())), want)
