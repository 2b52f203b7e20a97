"""Host side of the dense ops: config rules, refusals, default choice and the empty cases, which
return or raise before any kernel runs (kernel exactness: tests/kernels/test_maxsim_dense.py)."""

import dataclasses
import pytest
import torch

from tilemaxsim_plaid.ops import dense, launch
from tilemaxsim_plaid.ops.dense import (HELD_CHUNK_COLUMNS, HELD_CHUNKED_MAX_DIM,
                                        HELD_ONE_WARP_MAX_DIM, MANY_DOCS,
                                        PER_DOCUMENT_MIN_BYTES, WIDE_PER_DOCUMENT_MIN_TOKENS,
                                        MaxSimConfig, default_config, default_query_chunks,
                                        maxsim_packed, maxsim_padded)
from tilemaxsim_plaid.ops.launch import memory_bandwidth


def _packed(lengths, d, device):
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    D = torch.randn(int(offsets[-1]), d).to(torch.float16).to(device)
    return D, offsets.to(device)


def _query(B, Lq, d, device):
    return torch.randn(B, Lq, d).to(torch.float16).to(device)


@pytest.mark.parametrize("config", [
    pytest.param(MaxSimConfig(block_t=48), id="block_t-not-pow2"),
    pytest.param(MaxSimConfig(queries_per_block=3), id="queries-not-pow2"),
    pytest.param(MaxSimConfig(docs_per_program=0), id="no-docs"),
    pytest.param(MaxSimConfig(block_t=4, docs_per_program=2, slots=True), id="slot-tile-too-small"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=3, slots=True), id="slots-not-pow2"),
    pytest.param(MaxSimConfig(block_t=16, length_order=True), id="length-order-without-slots"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=2, slots=True, q_blocks_per_program=2),
                 id="slots-2qblocks"),
    pytest.param(MaxSimConfig(hold_query=True, q_blocks_per_program=2), id="hold-query-2qblocks"),
    pytest.param(MaxSimConfig(block_t=16, docs_per_program=2, slots=True, hold_query=True),
                 id="hold-query-and-slots"),
    pytest.param(MaxSimConfig(block_d=48), id="block_d-not-pow2"),
    pytest.param(MaxSimConfig(block_d=8), id="block_d-below-16"),
    pytest.param(MaxSimConfig(block_d=256), id="block_d-above-128"),
])
def test_bad_config_is_rejected_before_launch(config, device):
    D, offsets = _packed([5, 7], 64, device)
    with pytest.raises(ValueError, match="config"):
        maxsim_packed(_query(1, 8, 64, device), D, offsets, config=config)


def test_held_query_refuses_more_chunks_than_it_holds(device):
    """hold_query holds one register tile per chunk of d, at most MAX_HELD_CHUNKS: d = 384 in
    chunks of 16 (24) is refused naming the count; in chunks of 32 (12) it is taken."""
    from tilemaxsim_plaid.ops.dense import MAX_HELD_CHUNKS

    D, offsets = _packed([5, 7], 384, device)
    Q = _query(1, 8, 384, device)
    with pytest.raises(ValueError, match=rf"hold_query needs at most {MAX_HELD_CHUNKS} chunks of d.*got 24 chunks"):
        maxsim_packed(Q, D, offsets, config=MaxSimConfig(block_t=16, hold_query=True, block_d=16))
    assert 384 // 32 <= MAX_HELD_CHUNKS < 384 // 16
    out = maxsim_packed(Q, D, offsets, config=MaxSimConfig(block_t=16, hold_query=True, block_d=32))
    assert out.shape == (1, 2)


@pytest.mark.parametrize("path", [dict(single_tile=True, block_t=16), dict(slots=True, block_t=4, docs_per_program=4)])
def test_running_max_refuses_the_paths_without_a_tile_loop(path, device):
    D, offsets = _packed([5, 7], 64, device)
    with pytest.raises(ValueError, match="config.running_max needs the tiled per-document path"):
        maxsim_packed(_query(1, 8, 64, device), D, offsets,
                      config=MaxSimConfig(running_max=True, **path))


@pytest.mark.parametrize("block_d", [0, 48, 8, 256, 64.0, True, "32"])
def test_block_d_outside_its_rule_is_refused_naming_it(block_d, device):
    """block_d is None or a power of two in [16, 128], refused before anything is scored, also
    with no documents."""
    D, offsets = _packed([5, 7], 64, device)
    config = MaxSimConfig(block_d=block_d)
    with pytest.raises(ValueError, match=r"config\.block_d must be None or a power of two in "
                                         r"\[16, 128\]"):
        maxsim_packed(_query(1, 8, 64, device), D, offsets, config=config)
    with pytest.raises(ValueError, match=r"config\.block_d"):
        maxsim_packed(_query(1, 8, 64, device), D[:0], offsets[:1], config=config)
    with pytest.raises(ValueError, match=r"config\.block_d"):
        maxsim_padded(_query(2, 8, 64, device), D.reshape(2, 6, 64), config=config)


@pytest.mark.parametrize("config", [
    pytest.param(MaxSimConfig(block_t=16, block_d=16, single_tile=True), id="single_tile"),
])
def test_one_chunk_paths_refuse_a_block_d_that_splits_d(config, device):
    """single_tile holds d in one chunk: a block_d narrower than d is refused, naming
    config.block_d (d = 64 in chunks of 16)."""
    D, offsets = _packed([5, 7], 64, device)
    with pytest.raises(ValueError, match=r"config\.block_d=16 splits d=64 into 4 chunks"):
        maxsim_packed(_query(1, 8, 64, device), D, offsets, config=config)
    with pytest.raises(ValueError, match=r"config\.block_d"):
        maxsim_padded(_query(1, 8, 64, device), D.reshape(2, 6, 64), config=config)


def test_single_tile_config_rejects_long_documents(device):
    D, offsets = _packed([100], 128, device)
    with pytest.raises(ValueError, match="single_tile"):
        maxsim_packed(_query(1, 8, 128, device), D, offsets,
                      config=MaxSimConfig(block_t=64, single_tile=True))


def test_slots_are_for_the_packed_layout(device):
    D = torch.randn(3, 8, 64).to(torch.float16).to(device)
    with pytest.raises(ValueError, match="config.slots"):
        maxsim_padded(_query(2, 8, 64, device), D,
                      config=MaxSimConfig(block_t=16, docs_per_program=2, slots=True))


def test_default_config_by_number_of_documents():
    many = default_config(1, 32, 180, 128, variable_lengths=True, num_docs=MANY_DOCS)
    assert (many.num_warps, many.block_t, many.docs_per_program, many.hold_query) == (1, 16, 4, True)
    # A query block of 64 rows or more holds the query across 4 warps, packed or padded.
    for Lq in (33, 64, 128):
        for packed in (True, False):
            longer = default_config(1, Lq, 180, 128, variable_lengths=packed, num_docs=MANY_DOCS)
            assert (longer.num_warps, longer.block_t, longer.docs_per_program,
                    longer.hold_query) == (4, 32, 8, True)
    # Padded documents with a 32-row query block keep per-document tiles sized to them.
    assert not default_config(1, 32, 128, 128, num_docs=MANY_DOCS).hold_query
    few = default_config(1, 32, 180, 128, variable_lengths=True, num_docs=MANY_DOCS - 1)
    assert (few.num_warps, few.hold_query) == (2, False)
    # The held query is one d chunk: wider embeddings keep the per-document default, and so do
    # fp32 inputs (twice the registers for the held tile; not timed).
    assert not default_config(1, 32, 180, 384, variable_lengths=True, num_docs=MANY_DOCS).hold_query
    assert not default_config(1, 32, 180, 128, variable_lengths=True, num_docs=MANY_DOCS,
                              element_size=4).hold_query


H100_BYTES_PER_S, H200_BYTES_PER_S = 3.35e12, 4.8e12


def test_default_config_takes_per_document_tiles_for_long_documents_on_a_slower_card():
    """One query of up to 32 tokens over many packed documents of PER_DOCUMENT_MIN_BYTES or
    more on average, d in one chunk: per-document tiles on a card of less bandwidth than
    PER_DOCUMENT_MAX_BANDWIDTH, the held query on a faster one or where the bandwidth or the
    mean length is unknown."""
    per_document = MaxSimConfig(block_t=32, num_warps=2, num_stages=2)

    def packed(Lq=32, dim=128, mean_tokens=70.0, read_bandwidth=H100_BYTES_PER_S, **kwargs):
        return default_config(1, Lq, 300, dim, variable_lengths=True, num_docs=MANY_DOCS,
                              mean_tokens=mean_tokens, read_bandwidth=read_bandwidth, **kwargs)

    for Lq in (1, 17, 32):
        assert packed(Lq) == per_document
    assert packed(dim=64, mean_tokens=150.0) == per_document
    assert packed(mean_tokens=PER_DOCUMENT_MIN_BYTES / 256) == per_document  # at the bound
    held = default_config(1, 32, 300, 128, variable_lengths=True, num_docs=MANY_DOCS)
    assert held.hold_query
    assert packed(read_bandwidth=H200_BYTES_PER_S) == held
    assert packed(read_bandwidth=None) == held
    assert packed(mean_tokens=None) == held
    assert packed(dim=64) == default_config(1, 32, 300, 64, variable_lengths=True,
                                            num_docs=MANY_DOCS)  # 9 KB documents
    assert packed(mean_tokens=PER_DOCUMENT_MIN_BYTES / 256 - 1).hold_query
    # A 64-row block, d held in chunks, fewer documents, fp32 and padded documents: unchanged.
    assert packed(Lq=64).hold_query and packed(Lq=64).num_warps == 4
    assert packed(dim=96, mean_tokens=200.0).block_d is not None
    assert default_config(1, 32, 300, 128, variable_lengths=True, num_docs=MANY_DOCS - 1,
                          mean_tokens=70.0, read_bandwidth=H100_BYTES_PER_S) == per_document
    assert not packed(element_size=4).hold_query
    padded = default_config(1, 32, 180, 128, num_docs=MANY_DOCS, mean_tokens=180.0,
                            read_bandwidth=H100_BYTES_PER_S)
    assert padded == default_config(1, 32, 180, 128, num_docs=MANY_DOCS)


def test_default_config_takes_whole_chunks_per_document_at_wide_d_on_a_slower_card():
    """At d in whole 128-column chunks past one, packed documents of WIDE_PER_DOCUMENT_MIN_TOKENS
    or more on average, on a card of less bandwidth, take per-document 64-token tiles over those
    chunks, at any number of documents; shorter documents, d with a remainder past 128 columns,
    a faster card and fp32 keep theirs."""
    wide = MaxSimConfig(block_t=64, num_warps=4, num_stages=3, block_d=128)

    def packed(dim, mean_tokens=150.0, read_bandwidth=H100_BYTES_PER_S, num_docs=MANY_DOCS,
               **kwargs):
        return default_config(1, 32, 300, dim, variable_lengths=True, num_docs=num_docs,
                              mean_tokens=mean_tokens, read_bandwidth=read_bandwidth, **kwargs)

    for dim in (256, 384, 512, 640, 768):
        assert packed(dim) == wide
        assert packed(dim, num_docs=100) == wide
        assert packed(dim, mean_tokens=WIDE_PER_DOCUMENT_MIN_TOKENS) == wide  # at the bound
        for kwargs in ({"mean_tokens": WIDE_PER_DOCUMENT_MIN_TOKENS - 1},
                       {"mean_tokens": None}, {"read_bandwidth": H200_BYTES_PER_S},
                       {"element_size": 4}):
            assert packed(dim, **kwargs) == packed(dim, **{**kwargs, "read_bandwidth": None})
            assert packed(dim, **kwargs) != wide
    assert packed(256, mean_tokens=70.0).hold_query  # the held query in 64-column chunks
    for dim in (320, 576):
        assert packed(dim) == packed(dim, read_bandwidth=None)
    assert default_config(1, 64, 300, 512, variable_lengths=True, num_docs=MANY_DOCS,
                          mean_tokens=150.0, read_bandwidth=H100_BYTES_PER_S) != wide


def test_memory_bandwidth_from_the_memory_clock_and_bus(monkeypatch):
    assert memory_bandwidth(torch.device("cpu")) is None

    class Props:
        memory_clock_rate, memory_bus_width = 2_619_000, 5120  # kHz, bits: an H100 SXM

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    launch._memory_bandwidth.cache_clear()
    try:
        assert memory_bandwidth(torch.device("cuda", 0)) == pytest.approx(3.352e12, rel=1e-3)
        Props.memory_clock_rate = 0  # not reported
        launch._memory_bandwidth.cache_clear()
        assert memory_bandwidth(torch.device("cuda", 0)) is None
    finally:
        launch._memory_bandwidth.cache_clear()


def test_default_config_tiles_padded_documents_past_128_tokens_as_varied_ones():
    assert default_config(1, 32, 180, 128, num_docs=MANY_DOCS) == MaxSimConfig(
        block_t=32, num_warps=2, num_stages=2)
    # Multiples of 128, and one tile's length, keep tiles sized to the documents.
    for max_len, block_t in ((256, 128), (128, 128), (100, 128)):
        assert default_config(1, 32, max_len, 128, num_docs=MANY_DOCS) == MaxSimConfig(
            block_t=block_t, num_warps=4, num_stages=2)
    assert default_config(1, 32, 64, 128, num_docs=MANY_DOCS - 1) == MaxSimConfig(
        block_t=64, num_warps=4, num_stages=2)


def test_default_config_holds_the_query_over_short_padded_documents():
    for max_len, block_t in ((8, 16), (16, 16), (32, 32), (64, 32)):
        assert default_config(1, 32, max_len, 128, num_docs=MANY_DOCS) == MaxSimConfig(
            block_t=block_t, num_warps=1, num_stages=3, docs_per_program=16, hold_query=True,
            running_max=True)
    # Not past 64 tokens, for a 64-row query block (held across 4 warps), for fp32, or for d
    # past one chunk.
    assert not default_config(1, 32, 65, 128, num_docs=MANY_DOCS).running_max
    assert default_config(1, 64, 64, 128, num_docs=MANY_DOCS).num_warps == 4
    assert not default_config(1, 32, 64, 128, num_docs=MANY_DOCS, element_size=4).hold_query
    assert not default_config(1, 32, 64, 384, num_docs=MANY_DOCS).hold_query


def test_default_config_for_full_query_blocks_of_several_queries():
    """Many packed documents and a full 128-row block of several queries: eight documents a
    tile in order of length; a head that holds its split query's tail: the held block."""
    slots = MaxSimConfig(block_t=16, queries_per_block=4, docs_per_program=8, slots=True,
                         num_warps=4, num_stages=2, length_order=True)
    held = MaxSimConfig(block_t=32, queries_per_block=4, docs_per_program=8, hold_query=True,
                        num_warps=4, num_stages=3)
    for B in (4, 16, 32):
        assert default_config(B, 32, 300, 128, variable_lengths=True, num_docs=MANY_DOCS) == slots
        assert default_config(B, 32, 300, 128, variable_lengths=True, num_docs=MANY_DOCS,
                              joins_tail=True) == held
    assert default_config(4, 17, 300, 128, variable_lengths=True, num_docs=MANY_DOCS) == slots
    assert default_config(4, 64, 300, 64, variable_lengths=True,
                          num_docs=MANY_DOCS) == dataclasses.replace(slots, queries_per_block=2)
    assert default_config(4, 64, 300, 64, variable_lengths=True, num_docs=MANY_DOCS,
                          joins_tail=True) == dataclasses.replace(held, queries_per_block=2)
    # Not for fewer rows than 128 (B = 2 at 32 tokens), short queries, padded or few documents,
    # fp32, d past one chunk, or documents that fit one tile (the cross-query tiles).
    for B, Lq, max_len, d, packed, docs, size in [
            (2, 32, 300, 128, True, MANY_DOCS, 2), (8, 16, 300, 128, True, MANY_DOCS, 2),
            (4, 32, 300, 128, False, MANY_DOCS, 2), (4, 32, 300, 128, True, MANY_DOCS - 1, 2),
            (4, 32, 300, 128, True, MANY_DOCS, 4), (4, 32, 300, 256, True, MANY_DOCS, 2),
            (4, 32, 128, 128, True, MANY_DOCS, 2)]:
        for joins_tail in (False, True):
            cfg = default_config(B, Lq, max_len, d, variable_lengths=packed, num_docs=docs,
                                 element_size=size, joins_tail=joins_tail)
            assert not cfg.hold_query and cfg.docs_per_program != 8


def test_default_config_holds_d_past_one_chunk_in_chunks_that_divide_it():
    for Lq in (1, 16, 32):
        at_144 = default_config(1, Lq, 180, 144, variable_lengths=True, num_docs=MANY_DOCS)
        at_192 = default_config(1, Lq, 180, 192, variable_lengths=True, num_docs=MANY_DOCS)
        # 144 as 128 + 16 (a remainder chunk), 192 as 3 x 64.
        assert at_144 == MaxSimConfig(block_t=16, num_warps=1, num_stages=3, docs_per_program=4,
                                      hold_query=True, block_d=128)
        assert at_192 == dataclasses.replace(at_144, block_d=2 * HELD_CHUNK_COLUMNS)
    wide = default_config(1, 48, 180, 192, variable_lengths=True, num_docs=MANY_DOCS)
    assert (wide.hold_query, wide.num_warps, wide.block_d) == (True, 4, 2 * HELD_CHUNK_COLUMNS)
    # A 64-row block: 32-column chunks where they divide d, else the widest with a remainder.
    for dim, block_d in ((96, HELD_CHUNK_COLUMNS), (144, 128), (80, 64)):
        wide = default_config(1, 48, 180, dim, variable_lengths=True, num_docs=MANY_DOCS)
        assert (wide.hold_query, wide.num_warps, wide.block_d) == (True, 4, block_d), dim
    # Up to 16 tokens at a d that fits one chunk keep it.
    assert default_config(1, 16, 180, 96, variable_lengths=True, num_docs=MANY_DOCS).block_d is None
    # d = 256: up to 32 tokens held in one warp over 64-column chunks; a 64-row block is not
    # held, nor past HELD_ONE_WARP_MAX_DIM, nor d in between that 64 does not divide.
    for Lq in (1, 24, 32):
        at_256 = default_config(1, Lq, 180, 256, variable_lengths=True, num_docs=MANY_DOCS)
        assert at_256 == dataclasses.replace(at_144, block_d=2 * HELD_CHUNK_COLUMNS)
    for Lq, d in ((33, 256), (64, 256), (32, 2 * HELD_ONE_WARP_MAX_DIM), (32, 224)):
        assert not default_config(1, Lq, 180, d, variable_lengths=True,
                                  num_docs=MANY_DOCS).hold_query, (Lq, d)
    assert not default_config(1, 32, 180, 256, num_docs=MANY_DOCS).hold_query  # padded


@pytest.mark.parametrize("dim,block_d", [(80, 64), (96, 64), (144, 128), (160, 128), (176, 32)])
def test_default_config_holds_a_d_not_a_power_of_two_in_the_widest_chunks_with_a_remainder(
        dim, block_d):
    """One warp holds d in the widest chunks that leave a power-of-two remainder (80 = 64 + 16,
    144 = 128 + 16), else (176 = 5 x 32 + 16) in 32-column ones."""
    held = default_config(1, 32, 180, dim, variable_lengths=True, num_docs=MANY_DOCS)
    assert held == MaxSimConfig(block_t=16, num_warps=1, num_stages=3, docs_per_program=4,
                                hold_query=True, block_d=block_d)
    assert dense._remainder_chunk(dim, block_d) == dim % block_d > 0
    assert default_config(1, 17, 180, dim, variable_lengths=True, num_docs=MANY_DOCS) == held
    # Not for a shorter query block where d fits one chunk, a wider one, padded documents, few
    # documents, fp32, or past the cap.
    short = default_config(1, 16, 180, dim, variable_lengths=True, num_docs=MANY_DOCS)
    assert (short != held) == (dim <= 128)
    assert default_config(1, 33, 180, dim, variable_lengths=True, num_docs=MANY_DOCS) != held
    assert default_config(1, 32, 180, dim, num_docs=MANY_DOCS) != held
    assert default_config(1, 32, 180, dim, variable_lengths=True, num_docs=MANY_DOCS - 1) != held
    assert default_config(1, 32, 180, dim, variable_lengths=True, num_docs=MANY_DOCS,
                          element_size=4) != held
    assert not default_config(1, 32, 180, HELD_CHUNKED_MAX_DIM + 16, variable_lengths=True,
                              num_docs=MANY_DOCS).hold_query
    # A wider query block held across 4 warps takes 32-column chunks where they divide d
    # (d = 96), else the same widest chunks.
    for wide_dim, wide_block_d in ((96, HELD_CHUNK_COLUMNS), (144, 128)):
        for Lq in (33, 64):
            wide = default_config(1, Lq, 180, wide_dim, variable_lengths=True, num_docs=MANY_DOCS)
            assert (wide.hold_query, wide.num_warps, wide.block_t, wide.docs_per_program,
                    wide.block_d) == (True, 4, 32, 8, wide_block_d)
    # Powers of two, and d that 32-column chunks would pad as much (48, 112), keep one chunk.
    for one_chunk in (64, 128, 48, 112):
        assert default_config(1, 32, 180, one_chunk, variable_lengths=True,
                              num_docs=MANY_DOCS).block_d is None


def test_default_config_per_input_class():
    """The path each input class takes by default (what the GPU benchmarks time)."""
    # One query, padded documents: per-document tiles sized to the documents.
    assert default_config(1, 32, 128, 128) == MaxSimConfig(block_t=128, num_warps=4, num_stages=2)
    assert default_config(1, 32, 300, 384).num_stages == 3
    # One query, packed, d > 128: 64-column chunks where 64 divides d, else the widest power of
    # two dividing d (no masked column), in narrow chunks with 64-token tiles of 4 warps.
    for dim in (192, 384, 768):
        assert default_config(1, 32, None, dim, variable_lengths=True) == MaxSimConfig(
            block_t=32, num_warps=2, num_stages=3, block_d=64)
    assert default_config(1, 32, None, 144, variable_lengths=True) == MaxSimConfig(
        block_t=64, num_warps=4, num_stages=3, block_d=16)
    # ... and so does a 64-row query block over wide d.
    assert default_config(1, 64, None, 384, variable_lengths=True) == MaxSimConfig(
        block_t=64, num_warps=4, num_stages=3, block_d=64)
    assert default_config(1, 32, None, 160, variable_lengths=True).block_d == 32
    assert default_config(1, 32, None, 200, variable_lengths=True).block_d == 128
    # One query, packed, few documents or unknown lengths: 32-token tiles, 2 warps.
    assert default_config(1, 32, None, 128, variable_lengths=True) == MaxSimConfig(
        block_t=32, num_warps=2, num_stages=2)
    # Several query blocks, short documents: cross-query single tiles.
    several = default_config(32, 32, 100, 128)
    assert several.single_tile and several.q_blocks_per_program == 8
    assert several.queries_per_block == 4
    # One query block of several queries over padded documents: nothing to share, plain
    # 64-token tiles; short packed documents keep single tiles.
    assert default_config(4, 32, 128, 128) == MaxSimConfig(block_t=64, queries_per_block=4)
    assert default_config(4, 32, 100, 128, variable_lengths=True).single_tile
    # Several queries, packed long documents: slots of four documents, 16 tokens each.
    slots = default_config(32, 32, 300, 128, variable_lengths=True)
    assert slots.slots and slots.docs_per_program == 4 and slots.block_t == 16
    # Many of them, the query block full (128 rows): in order of length; a block of fewer rows
    # (32 queries of one token) or few documents: in the order given.
    assert not slots.length_order
    assert default_config(16, 16, None, 128, True, num_docs=100_000).length_order
    assert default_config(32, 8, None, 128, True, num_docs=100_000).length_order
    assert not default_config(32, 1, None, 128, True, num_docs=100_000).length_order
    assert not default_config(4, 16, None, 128, True, num_docs=100_000).length_order
    # Several queries, padded long documents: plain 64-token tiles.
    assert default_config(32, 32, 300, 128) == MaxSimConfig(block_t=64, queries_per_block=4)


def test_empty_inputs(device):
    Q = _query(2, 4, 64, device)
    assert maxsim_padded(Q, torch.zeros(0, 5, 64, dtype=torch.float16, device=device)).shape == (2, 0)
    D = torch.randn(3, 5, 64).to(torch.float16).to(device)
    assert maxsim_padded(Q[:0], D).shape == (0, 3)
    # A query with no tokens scores 0 (the empty sum), never NaN.
    assert torch.equal(maxsim_padded(Q[:, :0], D), torch.zeros(2, 3, device=device))
    empty_offsets = torch.zeros(1, dtype=torch.int64, device=device)
    assert maxsim_packed(Q, D[0], empty_offsets).shape == (2, 0)
    pids = torch.empty(0, dtype=torch.int64, device=device)
    offsets = torch.tensor([0, 5], device=device)
    assert maxsim_packed(Q, D[0], offsets, pids).shape == (2, 0)


def test_default_query_chunks_split_past_a_power_of_two_for_several_queries():
    assert default_query_chunks(4, 33) == [32, 1]
    assert default_query_chunks(16, 48) == [32, 16]
    assert default_query_chunks(4, 80) == [64, 16]
    assert default_query_chunks(4, 96) == [64, 32]
    # One launch: fewer than 4 queries (the read bound), powers of two, up to 32 tokens, a rest
    # of more than half the power of two, past one launch's tokens.
    for B, Lq in [(3, 33), (1, 40), (4, 32), (4, 64), (4, 17), (4, 49), (4, 97), (4, 200)]:
        assert default_query_chunks(B, Lq) is None
