"""Host side of the residual op: config rules and refusals, the default configuration per input
class, and the decode tables the kernel reads (kernel exactness:
tests/kernels/test_maxsim_residual.py)."""

import dataclasses
import logging

import pytest
import torch

from tests.kernels.test_maxsim_residual import (  # noqa: F401
    NUM_CENTROIDS,
    expected,
    norms_of,
    poisoned_outputs,
    random_index,
    score,
    triton_default,
    unit_queries,
)
from tests.tolerances import assert_close
from tilemaxsim_plaid.ops.launch import pow2
from tilemaxsim_plaid.codecs.residual import bucket_table, field_order_weights
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
    assert default_residual_config(1, 32, num_docs=many, nbits=4).decode == "permute"
    assert default_residual_config(1, 32, num_docs=many, nbits=1).decode == "pairs"
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


@pytest.mark.parametrize("config,match", [
    pytest.param(ResidualConfig(block_t=24), "config.block_t must be a power of two >= 16",
                 id="block_t24"),
    pytest.param(ResidualConfig(block_t_tail=8), "config.block_t_tail", id="tail8"),
    pytest.param(ResidualConfig(block_d=0), "config.block_d must be None or a power of two",
                 id="block_d0"),
    pytest.param(ResidualConfig(block_d=96), "config.block_d", id="block_d96"),
    pytest.param(ResidualConfig(queries_per_block=0), "config.queries_per_block", id="qpb0"),
    pytest.param(ResidualConfig(docs_per_program=0), "config.docs_per_program must be an "
                 "integer >= 1", id="docs0"),
    pytest.param(ResidualConfig(docs_per_program=2.0), "config.docs_per_program", id="docs-float"),
    pytest.param(ResidualConfig(centroid_table="yes"), "config.centroid_table", id="table-str"),
    pytest.param(ResidualConfig(decode="lookup"), "config.decode must be one of", id="decode"),
    pytest.param(ResidualConfig(num_warps=0), "config.num_warps", id="warps0"),
    pytest.param(ResidualConfig(num_stages=0), "config.num_stages", id="stages0"),
    pytest.param(ResidualConfig(maxnreg=16), r"config.maxnreg must be None or an integer in "
                 r"\[24, 255\]", id="maxnreg16"),
    pytest.param(ResidualConfig(ptx_loads=1), "config.ptx_loads", id="ptx-int"),
    pytest.param(ResidualConfig(persistent=None), "config.persistent", id="persistent-None"),
    pytest.param(ResidualConfig(prefetch=1), "config.prefetch", id="prefetch-int"),
    pytest.param(ResidualConfig(half_table="fp16"), "config.half_table", id="half-str"),
    pytest.param(ResidualConfig(pipeline_codes=None), "config.pipeline_codes", id="pipeline-None"),
])
def test_every_config_field_is_checked(device, config, match):
    """check_config names the field and what it takes; maxsim_residual refuses the same config
    before it looks at the documents (here: none)."""
    with pytest.raises(ValueError, match=match):
        residual.check_config(config)
    index = random_index(device, 64, 2, lengths=[])
    with pytest.raises(ValueError, match=match):
        score(unit_queries(1, 4, 64, torch.float16, device), index, 2, config=config)


def test_config_rules_name_every_field_and_take_the_defaults():
    assert set(residual.CONFIG_FIELDS) == {f.name for f in dataclasses.fields(ResidualConfig)}
    residual.check_config(ResidualConfig())
    for B, Lq, split, num_docs, element_size, half in [
            (1, 32, False, 10, 2, False), (1, 32, False, MANY_DOCS, 2, False),
            (1, 32, False, MANY_DOCS, 2, True), (1, 32, True, MANY_DOCS, 4, False),
            (8, 32, False, MANY_DOCS, 2, False), (3, 1, False, 5, 4, False)]:
        residual.check_config(default_residual_config(B, Lq, split, num_docs, element_size, half))


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


def permute_words(weights: torch.Tensor, nbits: int, dtype: torch.dtype) -> list[int]:
    """The byte permutes' registers as kernels/maxsim_residual._permute_registers lays them out,
    built here from the codec's own field order: the low bytes of the weights (cast to
    ``dtype``) in field order, then their high bytes; nbits = 2 as two 32-bit words, nbits = 4
    as four 64-bit ones (fields 0-7, then 8-15)."""
    bits = field_order_weights(weights, nbits).to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF
    per_word = 4 if nbits == 2 else 8
    words = []
    for part in (bits & 0xFF, bits >> 8):
        for first in range(0, 1 << nbits, per_word):
            words.append(sum(int(b) << (8 * k) for k, b in enumerate(part[first:first + per_word])))
    return words


def _prmt(source: int, selector: int) -> int:
    """PTX prmt.b32 on the 8 bytes of ``source``: 4 selector nibbles, bit 3 replicates the sign."""
    out = 0
    for k in range(4):
        nibble = (selector >> (4 * k)) & 0xF
        byte = (source >> (8 * (nibble & 7))) & 0xFF
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def _halves(pair: int) -> torch.Tensor:
    """The two fp16 weights packed in a 32-bit value, low half first."""
    return torch.tensor([pair & 0xFFFF, pair >> 16], dtype=torch.int32).to(torch.int16).view(
        torch.float16)


def test_permute_selectors_match_the_codec_layout():
    """The nbits = 2 byte-permute decoder's arithmetic, replayed in Python on every byte value in
    every byte of a word: word >> (6 - 2j) & 0x03030303, times 0x11 plus 0x40404040, selects (from
    the two registers of permute_words) the weights of dimensions j, 4 + j (low 16 bits) and
    8 + j, 12 + j (high 16 bits), as the codec's own bucket table decodes them."""
    weights = torch.sort(torch.randn(4)).values
    lo, hi = permute_words(weights, 2, torch.float16)
    source = lo | hi << 32
    buckets = bucket_table(2)  # [256, 4]: bucket of each dimension of a byte
    generator = torch.Generator().manual_seed(0)
    words = [b * 0x01010101 for b in range(256)]  # every byte value, in every byte at once
    words += torch.randint(0, 2**32, (64,), generator=generator, dtype=torch.int64).tolist()
    for word in words:
        dims = buckets[torch.tensor(list(word.to_bytes(4, "little")))].reshape(16)
        for j in range(4):
            selector = ((word >> (6 - 2 * j)) & 0x03030303) * 0x11 + 0x40404040
            for h in range(2):
                got = _halves(_prmt(source, selector >> (16 * h)))
                want = weights[dims[[8 * h + j, 8 * h + 4 + j]]].half()
                assert torch.equal(got, want), (hex(word), j, h)


def test_permute_nibbles_match_the_codec_layout():
    """The nbits = 4 byte-permute decoder (kernels/maxsim_residual._permute_nibbles), replayed in
    Python on every half-word value: selector = fields & 0x7777, the top-bit mask by a
    sign-replicating permute of (fields << 4, fields) with 0xD9C8, low and high bytes from
    fields 0-7 or 8-15 picked byte by byte, and the interleaves 0x4051 / 0x6273 give the weights
    of the half-word's dimensions (0, 1) and (2, 3), as the codec's own bucket table decodes
    them."""
    weights = torch.sort(torch.randn(16)).values
    low_a, low_b, high_a, high_b = permute_words(weights, 4, torch.float16)
    buckets = bucket_table(4)  # [256, 2]: bucket of each dimension of a byte

    def select(a: int, b: int, mask: int) -> int:
        return (a & ~mask | b & mask) & 0xFFFFFFFF

    for half in range(1 << 16):
        selector = half & 0x7777
        top = _prmt((half << 4 & 0xFFFFFFFF) | half << 32, 0xD9C8)
        low = select(_prmt(low_a, selector), _prmt(low_b, selector), top)
        high = select(_prmt(high_a, selector), _prmt(high_b, selector), top)
        dims = buckets[torch.tensor([half & 0xFF, half >> 8])].reshape(4)
        for h, order in enumerate((0x4051, 0x6273)):
            got = _halves(_prmt(low | high << 32, order))
            want = weights[dims[[2 * h, 2 * h + 1]]].half()
            assert torch.equal(got, want), (hex(half), h)


@pytest.mark.parametrize("group", [1, 2])
def test_decode_table_of_a_strided_or_non_finite_weight_view(group):
    """A strided view of bucket_weights (another dtype than the table's) gives the table of its
    contiguous copy, value for value, NaN and inf included (the table gathers the weights cast
    to its dtype; a cast may give a NaN another payload, so NaN matches NaN); the byte permutes
    (group 0) need no table."""
    nbits, dtype = (2, torch.float16) if group == 2 else (4, torch.bfloat16)
    weights = torch.sort(torch.randn(1 << nbits)).values
    weights[1], weights[-1] = float("nan"), float("inf")
    strided = torch.stack([weights, -weights], 1)[:, 0]
    assert not strided.is_contiguous()
    got = decode_table(strided, nbits, dtype, group)
    want = decode_table(weights.contiguous(), nbits, dtype, group)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.view(dtype), want.view(dtype), rtol=0, atol=0, equal_nan=True)
    assert got.view(dtype).isnan().any() and got.view(dtype).isinf().any()
    for other in (0, 3):
        with pytest.raises(ValueError, match="need no table"):
            decode_table(weights, nbits, dtype, other)


def test_default_decode_by_path(device, monkeypatch, triton_default):
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
def test_default_launch_per_input_class(device, monkeypatch, triton_default, dtype, split,
                                        inv_norms, many, want):
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


@pytest.mark.parametrize("nbits,decoder,maxnreg,ahead", [
    (1, "pairs", 96, False), (2, "permute", 96, True), (4, "permute", 128, True)])
def test_default_launch_per_nbits(device, monkeypatch, triton_default, nbits, decoder, maxnreg,
                                  ahead):
    """One fp16 query over many documents on the table path: byte permutes at nbits = 2 and 4,
    under the register cap they do not spill under, with codes a tile ahead; the pair table
    with codes per tile at nbits = 1."""
    kernel = RecordingKernel()
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", kernel)
    monkeypatch.setattr(residual, "MANY_DOCS", 4)
    index = random_index(device, 128, nbits, lengths=[3] * 4)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    score(Q, index, nbits, inv_norms=norms_of(index, nbits), validate=False)
    (_, kwargs), = kernel.launches
    assert (kwargs["DECODE_GROUP"], kwargs["maxnreg"], kwargs["PIPELINE_CODES"]) == (
        residual.DECODERS[decoder], maxnreg, ahead)
    assert residual.default_residual_config(1, 32, False, 4, 2, True, nbits).maxnreg == maxnreg


def _index_at(num_centroids, device, dim=128, nbits=2):
    """A small index whose codes span num_centroids centroids (one row, broadcast: no memory)."""
    index = random_index(device, dim, nbits, lengths=[3, 4, 2])
    index["centroids"] = index["centroids"][:1].expand(num_centroids, dim)
    index["codes"] = torch.randint(0, num_centroids, index["codes"].shape, dtype=torch.int32,
                                   device=device)
    return index


@pytest.mark.parametrize("dtype,C,Lq,tokens_per_launch,table_path", [
    pytest.param(torch.float16, 1 << 18, 32, [32], True, id="fp16-table-within-budget"),
    pytest.param(torch.float32, 1 << 18, 32, [32], True, id="fp32-one-query-whole"),
    pytest.param(torch.float32, 1 << 18, 96, [24] * 4, True, id="fp32-96-rows-four-tiles"),
    pytest.param(torch.float32, 1 << 20, 32, [32], False, id="fp32-no-tile-fits-gather"),
    pytest.param(torch.float16, 1 << 21, 64, [64], False, id="fp16-no-tile-fits-gather"),
])
def test_centroid_table_counted_in_its_dtype(device, monkeypatch, caplog, triton_default, dtype,
                                             C, Lq, tokens_per_launch, table_path):
    """MS MARCO's C = 2**18: a 32-token query's fp16 table (16 MiB) fits
    MAX_CENTROID_TABLE_BYTES; its fp32 table (32 MiB) does not, but one query's table is used
    whole (WHOLE_TABLE_ROWS) where it would be split. A 96-token query's table (96 MiB) is split
    into four 24-row tables, logged once at INFO. Where not even a 16-row tile fits (C = 2**20
    at fp32, 2**21 at fp16), a table the op would build is not: centroid rows are gathered, the
    one WARNING, logged once."""
    kernel = RecordingKernel()
    built = []
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", kernel)
    monkeypatch.setattr(residual, "MANY_DOCS", 2)
    monkeypatch.setattr(residual, "_logged_no_table", set())
    monkeypatch.setattr(residual, "_logged_tiles", set())
    monkeypatch.setattr(residual, "query_centroid_scores", lambda Q3, c, dt=torch.float32: (
        built.append((dt, Q3.shape[1])) or torch.zeros(c.shape[0], Q3.shape[0] * Q3.shape[1],
                                                        dtype=dt)))
    assert residual.centroid_table_fits(1 << 18, 32, 2)
    assert not residual.centroid_table_fits(1 << 18, 32, 4)
    assert not residual.centroid_table_fits(1 << 18, 32)  # the default is fp32
    index = _index_at(C, device)
    Q = unit_queries(1, Lq, 128, dtype, device)
    inv_norms = torch.ones(index["codes"].shape[0], device=device)
    with caplog.at_level("INFO", logger=residual.__name__):
        for _ in range(2):
            score(Q, index, 2, inv_norms=inv_norms)
    launches = [kwargs for _, kwargs in kernel.launches]
    # LQ: the launch's query rows rounded up to a power of two
    assert [kwargs["LQ"] for kwargs in launches] == [pow2(n) for n in tokens_per_launch] * 2
    assert all(kwargs["CENTROID_TABLE"] is table_path for kwargs in launches)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    if table_path:
        table_dtype = torch.float16 if dtype == torch.float16 else torch.float32
        assert built == [(table_dtype, n) for n in tokens_per_launch] * 2
        assert not warnings
        if dtype == torch.float16:
            assert launches[0]["DECODE_GROUP"] == 0  # the permute decoder of the fp16 default
        if len(tokens_per_launch) == 1:
            assert not infos
        else:
            (message,) = infos  # once, not per call
            assert f"C={C}" in message and "96.0 MiB" in message
            assert "4 launches of 1 x 24" in message
    else:
        assert built == [] and not infos
        assert launches[0]["DECODE_GROUP"] == 2
        (message,) = warnings  # once, not per call
        size = C * Lq * (2 if dtype == torch.float16 else 4) / 2**20
        assert f"C={C}" in message and f"B*Lq={Lq}" in message
        assert f"{size:.1f} MiB" in message and "gathering centroid rows" in message


def test_a_given_or_needed_table_is_whole_where_no_tile_fits(device, monkeypatch, caplog):
    """C = 2**20, one 32-token query: no 16-row fp32 tile fits the budget. A table the op would
    build is gathered instead; a caller's table (PLAID's stage 1) and split_query's own table
    (which it needs) are read whole in one launch, with no log line."""
    kernel = RecordingKernel()
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", kernel)
    monkeypatch.setattr(residual, "_logged_no_table", set())
    monkeypatch.setattr(residual, "query_centroid_scores", lambda Q3, c, dt=torch.float32:
                        torch.zeros(c.shape[0], Q3.shape[0] * Q3.shape[1], dtype=dt))
    monkeypatch.setattr(residual, "split_query_centroid_scores", lambda Q3, c: (
        torch.zeros(c.shape[0], Q3.shape[1], device=Q3.device), Q3.half(), Q3.half()))
    C = 1 << 20
    assert residual.centroid_table_tiles(C, 1, 32, builds=True) is None
    assert residual.centroid_table_tiles(C, 1, 32) == (1, 32)
    assert residual.centroid_table_tiles(C, 1, 96) is None  # wider than WHOLE_TABLE_ROWS
    index = _index_at(C, device)
    Q = unit_queries(1, 32, 128, torch.float32, device)
    inv_norms = torch.ones(index["codes"].shape[0], device=device)
    given = torch.zeros(C, 32, device=device)
    with caplog.at_level("INFO", logger=residual.__name__):
        score(Q, index, 2, inv_norms=inv_norms, centroid_scores=given)
        score(Q, index, 2, inv_norms=inv_norms, split_query=True)
        assert not caplog.records
        score(Q, index, 2, inv_norms=inv_norms)
    assert [(kw["LQ"], kw["CENTROID_TABLE"]) for _, kw in kernel.launches] == [
        (32, True), (32, True), (32, False)]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_one_fp16_query_over_few_documents_gathers_centroid_rows(device, monkeypatch):
    """Below MANY_DOCS scored documents one fp16 query gathers centroid rows rather than build
    its fp16 table, at any C; from MANY_DOCS on, with several queries, fp32 products, a
    caller's table or an explicit centroid_table=True it reads a table."""
    kernel = RecordingKernel()
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", kernel)
    monkeypatch.setattr(residual, "MMA_NBITS", ())  # the Triton launch at every count
    index = _index_at(1 << 16, device)  # 3 documents
    inv_norms = torch.ones(index["codes"].shape[0], device=device)
    one, two = (unit_queries(B, 32, 128, torch.float16, device) for B in (1, 2))
    fp32 = unit_queries(1, 32, 128, torch.float32, device)
    table = torch.zeros(1 << 16, 32, dtype=torch.float16, device=device)
    score(one, index, 2, inv_norms=inv_norms)
    score(two, index, 2, inv_norms=inv_norms)
    score(fp32, index, 2, inv_norms=inv_norms)
    score(one, index, 2, inv_norms=inv_norms, centroid_scores=table)
    score(one, index, 2, inv_norms=inv_norms, config=ResidualConfig(centroid_table=True))
    monkeypatch.setattr(residual, "MANY_DOCS", 3)
    score(one, index, 2, inv_norms=inv_norms)
    assert [kw["CENTROID_TABLE"] for _, kw in kernel.launches] == [False, True, True, True,
                                                                  True, True]
    assert kernel.launches[0][1]["DECODE_GROUP"] == residual.DECODERS["pairs"]


@pytest.mark.parametrize("C,B,Lq,element_size,want", [
    pytest.param(1 << 16, 1, 32, 4, (1, 32), id="C2^16-whole"),
    pytest.param(1 << 18, 1, 32, 2, (1, 32), id="C2^18-fp16-whole"),
    pytest.param(1 << 18, 1, 32, 4, (1, 32), id="C2^18-fp32-one-query-whole"),
    pytest.param(1 << 18, 1, 64, 4, (1, 64), id="C2^18-Lq64-whole"),
    pytest.param(1 << 18, 2, 32, 4, (2, 32), id="C2^18-64-rows-whole"),
    pytest.param(1 << 20, 1, 64, 4, (1, 64), id="C2^20-Lq64-whole"),
    pytest.param(1 << 20, 1, 64, 2, (1, 64), id="C2^20-fp16-Lq64-whole"),
    pytest.param(1 << 18, 1, 65, 4, (1, 22), id="C2^18-Lq65-three-tiles"),
    pytest.param(1 << 18, 1, 96, 4, (1, 24), id="C2^18-Lq96-four-tiles"),
    pytest.param(1 << 18, 9, 8, 4, (3, 8), id="C2^18-whole-queries-per-launch"),
    pytest.param(1 << 18, 3, 32, 2, (1, 32), id="C2^18-fp16-one-query-per-launch"),
    pytest.param(1 << 19, 1, 96, 4, None, id="C2^19-tiles-too-narrow"),
    pytest.param(1 << 19, 6, 12, 4, (1, 12), id="C2^19-narrow-whole-query"),
    pytest.param(1 << 30, 65, 1, 4, None, id="no-row-fits"),
    pytest.param(0, 1, 32, 4, (1, 32), id="no-centroids"),
])
def test_centroid_table_tiles(C, B, Lq, element_size, want):
    """The split of a table over launches: one launch for at most WHOLE_TABLE_ROWS rows; a wider
    table whole queries first, then the fewest equal token tiles; every split launch's table
    fits, and no tile of a query is narrower than 16 rows. A table the op would build (builds)
    differs only where no tile fits: its centroid rows are gathered."""
    tiles = residual.centroid_table_tiles(C, B, Lq, element_size)
    assert tiles == want
    built = residual.centroid_table_tiles(C, B, Lq, element_size, builds=True)
    no_tile_fits = residual._budget_tiles(C, B, Lq, element_size) is None
    assert built == (None if no_tile_fits else want)
    if tiles is not None and B * Lq > residual.WHOLE_TABLE_ROWS:
        queries, tokens = tiles
        assert residual.centroid_table_fits(C, queries * tokens, element_size)
        assert tokens == Lq or tokens >= residual.MIN_TABLE_TILE_ROWS


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


def _tile_budget(monkeypatch, rows, element_size, num_centroids=NUM_CENTROIDS):
    """Make one launch's table hold ``rows`` query rows of this small index, as an fp32 table
    at C = 2**18 holds 24 (the real budget would need 2**18 centroids under the interpreter),
    and split every table over it (a query of 65 tokens and more at that C); returns the
    query-token counts the launches are given."""
    monkeypatch.setattr(residual, "MAX_CENTROID_TABLE_BYTES", rows * num_centroids * element_size)
    monkeypatch.setattr(residual, "WHOLE_TABLE_ROWS", 0)  # the split at this small size
    monkeypatch.setattr(residual, "_logged_tiles", set())
    launched = []
    real = residual._launch_kernel

    def recording(Q3, *args):
        launched.append(tuple(Q3.shape[:2]))
        return real(Q3, *args)

    monkeypatch.setattr(residual, "_launch_kernel", recording)
    return launched


TILED_INPUTS = [
    pytest.param(torch.float16, False, id="fp16"),
    pytest.param(torch.bfloat16, False, id="bf16"),
    pytest.param(torch.float32, False, id="fp32-tf32x3"),
    pytest.param(torch.float32, True, id="fp32-split"),
]


@pytest.mark.parametrize("nbits", [pytest.param(n, id=f"nbits{n}") for n in (1, 2, 4)])
@pytest.mark.parametrize("dtype,split", TILED_INPUTS)
@pytest.mark.parametrize("Lq,tokens", [pytest.param(33, 17, id="Lq33"),
                                       pytest.param(45, 23, id="Lq45")])
def test_tiled_table_is_exact(device, poisoned_outputs, monkeypatch, nbits, dtype, split, Lq,
                              tokens):
    """A table split by query tokens (two tiles per query, as 32 fp32 rows at C = 2**18) gives
    the float64 reference's scores: an empty document (DOC_LENGTHS) is -inf, a query with no
    tokens 0, one that ends in its first tile adds nothing from the second; pids repeat."""
    index = random_index(device, 128, nbits)
    entry_bytes = 2 if dtype == torch.float16 else 4
    launched = _tile_budget(monkeypatch, 24, entry_bytes)
    Q = unit_queries(3, Lq, 128, dtype, device)
    query_lengths = torch.tensor([Lq, 0, 10], device=device)
    pids = torch.tensor([5, 0, 2, 0, 4, 1, 3], device=device)
    out = score(Q, index, nbits, pids=pids, query_lengths=query_lengths,
                inv_norms=norms_of(index, nbits), split_query=split)
    assert launched == [(1, tokens), (1, Lq - tokens)] * 3
    op = "maxsim_residual_split" if split else "maxsim_residual"
    want = expected(Q, index, nbits, pids=pids, query_lengths=query_lengths)
    assert_close(out, want, op, dtype)
    assert torch.isneginf(out[[0, 2], 1]).all() and torch.equal(out[1].cpu(), torch.zeros(7))


@pytest.mark.parametrize("dtype,split", TILED_INPUTS)
def test_tiles_of_a_caller_table(device, poisoned_outputs, monkeypatch, dtype, split):
    """A caller's table (PLAID's stage 1) split into tiles: each tile's columns are the right
    ones (a whole table, then the same table in tiles, against the reference), over whole
    queries per launch as well as token tiles; fp16 tables go with fp16 queries."""
    index = random_index(device, 128, 2, centroid_dtype=torch.float32)
    Q = unit_queries(2, 40, 128, dtype, device)
    norms = norms_of(index, 2)
    table_dtype = torch.float16 if dtype == torch.float16 else torch.float32
    table = (index["centroids"].float() @ Q.reshape(-1, 128).float().T).to(table_dtype)
    op = "maxsim_residual_split" if split else "maxsim_residual"
    want = expected(Q, index, 2)
    for rows, launches in ((80, [(2, 40)]), (40, [(1, 40)] * 2), (24, [(1, 20)] * 4)):
        launched = _tile_budget(monkeypatch, rows, table.element_size())
        out = score(Q, index, 2, inv_norms=norms, centroid_scores=table, split_query=split)
        assert launched == launches
        assert_close(out, want, op, dtype)


def test_tiled_table_log_line(device, monkeypatch, caplog):
    """A split table is logged once at INFO with its launches, never as a WARNING; an explicit
    config.centroid_table=True keeps the one whole table."""
    index = random_index(device, 128, 2)
    norms = norms_of(index, 2)
    Q = unit_queries(1, 32, 128, torch.float32, device)
    launched = _tile_budget(monkeypatch, 24, 4)
    with caplog.at_level("INFO", logger=residual.__name__):
        tiled = score(Q, index, 2, inv_norms=norms)
        score(Q, index, 2, inv_norms=norms)
        whole = score(Q, index, 2, inv_norms=norms, config=ResidualConfig(centroid_table=True))
    assert launched == [(1, 16)] * 4 + [(1, 32)]
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert "2 launches of 1 x 16 query rows" in record.getMessage()
    assert_close(tiled, whole, "maxsim_residual", torch.float32)


def test_mma_default_where_it_applies_from_many_documents(device, monkeypatch):
    """config=None takes mma_default (MMA_DEFAULT, no prefetch where the L2 policies are taken)
    where scoring="mma" applies at an nbits of MMA_NBITS and NVRTC loads, from MANY_DOCS scored
    documents on (here lowered to 4); the Triton kernel below that, at other nbits or where the
    mma kernel does not apply (no kernel runs: both launches are recorded)."""
    from tilemaxsim_plaid.ops import residual_mma

    taken, reasons = [], ["a reason"]
    triton = RecordingKernel()
    monkeypatch.setattr(residual, "MANY_DOCS", 4)
    monkeypatch.setattr(residual, "MMA_NBITS", (2,))
    monkeypatch.setattr(residual, "_maxsim_residual_kernel", triton)
    monkeypatch.setattr(residual.nvrtc, "available", lambda: True)
    monkeypatch.setattr(residual_mma, "reasons_not_to_apply", lambda *args: reasons)
    # (grab, prefetch) of each launch
    monkeypatch.setattr(residual_mma, "launch_residual_mma", lambda *args: taken.append(
        args[13:15]) or torch.zeros(1, args[10], device=device))
    index = random_index(device, 128, 2, lengths=[3] * 4)
    Q = unit_queries(1, 32, 128, torch.float16, device)
    norms = norms_of(index, 2)
    score(Q, index, 2, inv_norms=norms)
    assert taken == [] and len(triton.launches) == 1
    reasons.clear()
    score(Q, index, 2, inv_norms=norms)
    assert taken == [(residual_mma.DEFAULT_GRAB, True)] and len(triton.launches) == 1
    monkeypatch.setattr(residual_mma, "L2_HINTS", True)  # as for a table of C = 2^18: no prefetch
    score(Q, index, 2, inv_norms=norms)
    assert taken[1:] == [(residual_mma.DEFAULT_GRAB, False)]
    taken.pop()
    monkeypatch.setattr(residual_mma, "L2_HINTS", None)
    score(Q, index, 2, pids=torch.tensor([0, 1, 2], device=device), inv_norms=norms)  # 3 < 4
    assert len(taken) == 1 and len(triton.launches) == 2
    monkeypatch.setattr(residual, "MMA_NBITS", ())
    score(Q, index, 2, inv_norms=norms)
    assert len(taken) == 1 and len(triton.launches) == 3
