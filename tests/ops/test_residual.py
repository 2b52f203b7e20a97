"""Host side of the residual op: config rules and refusals, the default configuration per input
class, and the decode tables the kernel reads (kernel exactness:
tests/kernels/test_maxsim_residual.py)."""

import pytest
import torch

from tests.kernels.test_maxsim_residual import (NUM_CENTROIDS, norms_of, random_index, score,
                                                unit_queries)
from tilemaxsim_plaid.codecs.residual import bucket_table
from tilemaxsim_plaid.ops import residual
from tilemaxsim_plaid.ops.residual import (MANY_DOCS, ResidualConfig, decode_table,
                                           default_residual_config, maxsim_residual)


def test_default_config_by_number_of_documents():
    few, many = MANY_DOCS - 1, MANY_DOCS
    assert default_residual_config(1, 32, num_docs=few) == ResidualConfig()
    assert default_residual_config(1, 32, split_query=True, num_docs=few) == ResidualConfig(block_t=32)
    fp16 = default_residual_config(1, 32, num_docs=many)
    split = default_residual_config(1, 32, split_query=True, num_docs=many, element_size=2)
    assert (fp16.num_warps, fp16.maxnreg, fp16.docs_per_program, fp16.persistent) == (1, 96, 2, True)
    assert (split.num_warps, split.maxnreg, split.docs_per_program, split.persistent) == (1, 128, 2, True)
    half = default_residual_config(1, 32, num_docs=many, half_table=True)
    assert (half.maxnreg, half.prefetch, fp16.prefetch, split.prefetch) == (96, True, False, False)
    assert (fp16.decode, half.decode, split.decode) == ("permute", "permute", "pairs")
    # Queries that share one block of at most 32 rows: still one query block, as the
    # persistent grid needs.
    for num_queries, Lq in ((2, 16), (3, 8), (5, 4)):
        cfg = default_residual_config(num_queries, Lq, num_docs=many)
        assert cfg.persistent and num_queries <= cfg.queries_per_block
    # Two 32-token queries share a 64-row block with 4 warps: no persistent grid there.
    assert not default_residual_config(2, 32, split_query=True, num_docs=many).persistent
    # tf32x3 tiles need ~200 registers: no cap for them.
    assert default_residual_config(1, 32, num_docs=many, element_size=4) == ResidualConfig()
    assert default_residual_config(8, 32, num_docs=many).num_warps == 4


def test_ptx_loads_only_on_a_gpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not residual._ptx_loads(ResidualConfig(ptx_loads=True))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert residual._ptx_loads(ResidualConfig())
    assert not residual._ptx_loads(ResidualConfig(ptx_loads=False))


@pytest.mark.parametrize("nbits", [pytest.param(n, id=f"nbits{n}") for n in (1, 2, 4)])
@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.float32, id="fp32")])
def test_pair_table_matches_the_codec_layout(nbits, dtype):
    """Entry (byte >> shift) & (2**(2*nbits) - 1) of the pair table holds the weights of the two
    dimensions of that byte in dimension order, as the codec's own bucket table decodes them."""
    weights = torch.sort(torch.randn(1 << nbits)).values
    table = decode_table(weights, nbits, dtype, group=2)
    pairs = table.view(dtype).reshape(-1, 2)  # little-endian: first dimension in the low half
    buckets = bucket_table(nbits)  # [256, slots]
    slots = 8 // nbits
    for byte in range(256):
        for slot in range(0, slots, 2):
            entry = (byte >> (8 - nbits * (slot + 2))) & ((1 << (2 * nbits)) - 1)
            want = weights[buckets[byte, slot:slot + 2]].to(dtype)
            assert torch.equal(pairs[entry], want), (byte, slot)


def test_permute_selectors_match_the_codec_layout():
    """The byte-permute decoder's arithmetic, replayed in Python on every byte value in every
    byte of a word: word >> (6 - 2j) & 0x03030303, times 0x11 plus 0x40404040, selects (from the
    two words decode_table(..., 0) gives) the weights of dimensions j, 4 + j (low 16 bits) and
    8 + j, 12 + j (high 16 bits), as the codec's own bucket table decodes them."""
    weights = torch.sort(torch.randn(4)).values
    lo, hi = (int(w) & 0xFFFFFFFF for w in decode_table(weights, 2, torch.float16, 0).tolist())
    source = lo | hi << 32
    buckets = bucket_table(2)  # [256, 4]: bucket of each dimension of a byte

    def permute(selector):
        return sum(((source >> (8 * ((selector >> (4 * k)) & 7))) & 0xFF) << (8 * k)
                   for k in range(4))

    def weights_of(pair):  # the two fp16 weights packed in a 32-bit value, low half first
        halves = torch.tensor([pair & 0xFFFF, pair >> 16], dtype=torch.int32).to(torch.int16)
        return halves.view(torch.float16)

    generator = torch.Generator().manual_seed(0)
    words = [b * 0x01010101 for b in range(256)]  # every byte value, in every byte at once
    words += torch.randint(0, 2**32, (64,), generator=generator, dtype=torch.int64).tolist()
    for word in words:
        dims = buckets[torch.tensor(list(word.to_bytes(4, "little")))].reshape(16)
        for j in range(4):
            selector = ((word >> (6 - 2 * j)) & 0x03030303) * 0x11 + 0x40404040
            for h in range(2):
                got = weights_of(permute(selector >> (16 * h)))
                want = weights[dims[[8 * h + j, 8 * h + 4 + j]]].half()
                assert torch.equal(got, want), (hex(word), j, h)
    with pytest.raises(ValueError, match="nbits = 2"):
        decode_table(weights[:2], 1, torch.float16, 0)
    with pytest.raises(ValueError, match="16-bit"):
        decode_table(weights, 2, torch.float32, 0)


def test_default_decode_by_path(device, monkeypatch):
    """The default decodes by byte permutes on the table path only: without inverse norms the
    centroid rows are gathered, and in permuted column order those would be 2-byte gathers."""
    launched = []

    class RecordingKernel:  # stands in for kernel[grid](...): records the decoder launched
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(kwargs["DECODE_GROUP"])

    monkeypatch.setattr(residual, "MANY_DOCS", 2)
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", RecordingKernel())
    index = random_index(device, 128, 2)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    score(Q, index, 2, inv_norms=norms_of(index, 2))
    score(Q, index, 2)
    assert launched == [residual.DECODERS["permute"], residual.DECODERS["pairs"]]


def test_bad_inputs_name_the_argument(device):
    index = random_index(device, 128, 2)
    Q = unit_queries(1, 8, 128, torch.float16, device)
    with pytest.raises(ValueError, match="nbits"):
        score(Q, index, 3)
    with pytest.raises(ValueError, match="residuals"):
        maxsim_residual(Q, index["codes"], index["residuals"][:, :16], index["offsets"],
                        index["centroids"], index["bucket_weights"], 2)
    with pytest.raises(ValueError, match="inv_norms"):
        score(Q, index, 2, config=ResidualConfig(centroid_table=True))
    with pytest.raises(ValueError, match="decode"):
        score(Q, index, 2, config=ResidualConfig(decode="lookup"))
    with pytest.raises(ValueError, match="maxnreg"):
        score(Q, index, 2, config=ResidualConfig(maxnreg=16))
    with pytest.raises(ValueError, match="codes"):
        bad = dict(index, codes=index["codes"] + NUM_CENTROIDS)
        score(Q, bad, 2)
    with pytest.raises(TypeError, match="residuals"):
        bad = dict(index, residuals=index["residuals"].to(torch.int32))
        score(Q, bad, 2)


class RecordingKernel:
    """Stands in for kernel[grid](...): records the grid and the launch's keyword arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, kwargs))


@pytest.mark.parametrize("dtype,split,inv_norms,many,want", [
    pytest.param(torch.float16, False, True, True,
                 dict(DECODE_GROUP=0, num_warps=1, maxnreg=96, PERSISTENT=True, BLOCK_T=16,
                      DOCS_PER_PROGRAM=2, CENTROID_TABLE=True), id="fp16-many-table"),
    pytest.param(torch.float16, False, False, True,
                 dict(DECODE_GROUP=2, num_warps=1, maxnreg=96, PERSISTENT=True,
                      CENTROID_TABLE=False), id="fp16-many-gather"),
    pytest.param(torch.float32, True, True, True,
                 dict(DECODE_GROUP=2, num_warps=1, maxnreg=128, PERSISTENT=True, SPLIT_Q=True),
                 id="split-many"),
    pytest.param(torch.float16, False, True, False,
                 dict(DECODE_GROUP=2, num_warps=2, maxnreg=None, PERSISTENT=False, BLOCK_T=16,
                      num_stages=1), id="fp16-few"),
    pytest.param(torch.float32, True, True, False,
                 dict(DECODE_GROUP=2, num_warps=2, BLOCK_T=32, SPLIT_Q=True), id="split-few"),
    pytest.param(torch.float32, False, True, True,
                 dict(DECODE_GROUP=2, num_warps=2, maxnreg=None, PERSISTENT=False,
                      INPUT_PRECISION="tf32x3"), id="fp32-tf32x3"),
])
def test_default_launch_per_input_class(device, monkeypatch, dtype, split, inv_norms, many, want):
    """What config=None launches for each input class (no kernel runs: the launch is recorded);
    "many" is at least MANY_DOCS documents, lowered here to keep the index small."""
    kernel = RecordingKernel()
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", kernel)
    monkeypatch.setattr(residual, "MANY_DOCS", 4)
    lengths = [3] * (4 if many else 3)
    index = random_index(device, 128, 2, lengths=lengths)
    Q = unit_queries(1, 32, 128, dtype, device)
    score(Q, index, 2, inv_norms=norms_of(index, 2) if inv_norms else None, split_query=split,
          validate=False)
    (_, kwargs), = kernel.launches
    assert {k: kwargs[k] for k in want} == want


def _index_at(num_centroids, device, dim=128, nbits=2):
    """A small index whose codes span num_centroids centroids (one row, broadcast: no memory)."""
    index = random_index(device, dim, nbits, lengths=[3, 4, 2])
    index["centroids"] = index["centroids"][:1].expand(num_centroids, dim)
    index["codes"] = torch.randint(0, num_centroids, index["codes"].shape, dtype=torch.int32,
                                   device=device)
    return index


@pytest.mark.parametrize("dtype,table_path,element_size", [
    pytest.param(torch.float16, True, 2, id="fp16-table-fits-at-2-bytes"),
    pytest.param(torch.float32, False, 4, id="fp32-judged-at-4-bytes"),
])
def test_centroid_table_counted_in_its_dtype(device, monkeypatch, caplog, dtype, table_path,
                                             element_size):
    """C = 2**18 and 32 query rows: the fp16 table (16 MiB) fits MAX_CENTROID_TABLE_BYTES and is
    taken; an fp32 table (32 MiB) does not: centroid rows are gathered, and that is logged once."""
    kernel = RecordingKernel()
    built = []
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", kernel)
    monkeypatch.setattr(residual, "MANY_DOCS", 2)
    monkeypatch.setattr(residual, "_logged_no_table", set())
    monkeypatch.setattr(residual, "query_centroid_scores", lambda Q3, c, dt=torch.float32: (
        built.append(dt) or torch.zeros(c.shape[0], Q3.shape[0] * Q3.shape[1], dtype=dt)))
    C, rows = 1 << 18, 32
    assert residual.centroid_table_fits(C, rows, 2)
    assert not residual.centroid_table_fits(C, rows, 4)
    assert not residual.centroid_table_fits(C, rows)  # the default is fp32
    index = _index_at(C, device)
    Q = unit_queries(1, rows, 128, dtype, device)
    inv_norms = torch.ones(index["codes"].shape[0], device=device)
    with caplog.at_level("INFO", logger=residual.__name__):
        for _ in range(2):
            score(Q, index, 2, inv_norms=inv_norms)
    (_, kwargs), _ = kernel.launches
    assert kwargs["CENTROID_TABLE"] is table_path
    if table_path:
        assert built == [torch.float16] * 2
        assert kwargs["DECODE_GROUP"] == 0  # the permute decoder of the fp16 default
        assert not caplog.records
    else:
        assert built == []
        assert kwargs["DECODE_GROUP"] == 2
        (record,) = caplog.records  # once, not per call
        message = record.getMessage()
        assert f"C={C}" in message and f"B*Lq={rows}" in message and "4-byte" in message
        assert "32.0 MiB" in message and "gathering centroid rows" in message


def test_caller_table_judged_at_its_own_bytes(device, monkeypatch):
    """A caller's fp16 table is judged at 2 bytes per entry."""
    kernel = RecordingKernel()
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", kernel)
    C, rows = 1 << 18, 32
    index = _index_at(C, device)
    Q = unit_queries(1, rows, 128, torch.float16, device)
    inv_norms = torch.ones(index["codes"].shape[0], device=device)
    table = torch.zeros(C, rows, dtype=torch.float16, device=device)
    score(Q, index, 2, inv_norms=inv_norms, centroid_scores=table)
    (_, kwargs), = kernel.launches
    assert kwargs["CENTROID_TABLE"] is True
