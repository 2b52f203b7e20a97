"""bench_dense_variants on the CPU interpreter: every variant is the default's launch with only
the row-offset width or the rows past a document's end changed, and scores as the default
(timing needs a GPU)."""

import dataclasses
import json

import pytest
import torch

from experiments import bench_dense_variants as dv
from experiments import bench_grid as bg
from experiments import harness
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops import dense


def test_variants_switch_the_row_offsets_and_restore_the_rule():
    rule = dense._tokens_i32
    args = (100, 2, 64, 256, 1)  # d = 256 in 4 chunks: the default takes 64-bit offsets
    assert not rule(*args)
    with dv.VARIANTS["int32 rows"]():
        assert dense._tokens_i32(*args)
    with dv.VARIANTS["int64 rows"]():
        assert not dense._tokens_i32(100, 1, 128, 128, 1)
    assert dense._tokens_i32 is rule


def test_variants_switch_repeated_rows_and_restore_the_rule():
    rule = dense._repeat_rows
    with dv.VARIANTS["repeated rows"]():
        assert dense._repeat_rows(1, dense.MaxSimConfig(), 128)
    with dv.VARIANTS["masked rows"]():
        assert not dense._repeat_rows(4, dense.MaxSimConfig(), 128)
    assert dense._repeat_rows is rule


def test_flat_documents_switch_where_the_kernel_applies_and_restore_the_rule():
    rule = dense._flat_documents
    held = dense.MaxSimConfig(block_t=16, docs_per_program=4, hold_query=True, num_warps=1)
    assert rule(1, held, True, 0, 30.0) and not rule(1, held, True, 0, 70.0)
    with dv.VARIANTS["flat documents"]():
        assert dense._flat_documents(1, held, True, 0, 70.0)
        assert dense._flat_documents(4, held, True, 0, 30.0)
        assert not dense._flat_documents(1, held, False, 0, 30.0)
    with dv.VARIANTS["loop per document"]():
        assert not dense._flat_documents(1, held, True, 0, 30.0)
    assert dense._flat_documents is rule


def test_remainder_switches_mask_it_or_widen_the_held_chunks_and_restore_the_rules():
    rule, config = dense._remainder_chunk, dense.default_config
    assert rule(144, 32) == 16 and rule(144, 128) == 16 and rule(96, 64) == 32
    assert rule(112, 64) == 0 and rule(80, 128) == 0 and rule(128, 64) == 0
    with dv.VARIANTS["masked remainder"]():
        assert dense._remainder_chunk(144, 32) == 0
    held = config(1, 48, None, 96, True, dense.MANY_DOCS)
    assert held.hold_query and held.block_d == 32
    with dv.VARIANTS["widest chunks"]():
        assert dense.default_config(1, 48, None, 96, True, dense.MANY_DOCS) == \
            dataclasses.replace(held, block_d=64)
        assert dense.default_config(1, 32, None, 96, True, dense.MANY_DOCS).block_d == 64
        # d = 112 is one masked 128-column chunk by default: nothing held in chunks to widen.
        assert dense.default_config(1, 32, None, 112, True, dense.MANY_DOCS).block_d is None
        several = config(4, 32, None, 144, True, dense.MANY_DOCS)
        assert dense.default_config(4, 32, None, 144, True, dense.MANY_DOCS) == several
    assert dense._remainder_chunk is rule and dense.default_config is config
    assert [dense._widest_chunk(d) for d in (80, 96, 112, 144, 160, 256, 72)] == [
        64, 64, 32, 128, 128, 128, None]


def test_cells_are_grid_cells_and_every_variant_scores_as_the_default():
    full = {c.key: c for c in bg.build_cells("full")}
    sizing = bg.Sizing(max_docs=3)
    for name in dv.CELLS:
        cell = dv.make_cell(name, bg.Sizing())
        assert full[cell.key].N == cell.N, name
    cell = dv.make_cell("d256-lognormal-30", sizing)
    rows = dv.run_cell(cell, 1, bg.wall_clock_ms, {}, torch.device("cpu"))
    # no peer wheels on the CPU
    assert [r["variant"] for r in rows] == [*dv.VARIANTS, "validate=False"]
    assert all(r["ms"] > 0 and r["shape"] == cell.name for r in rows)
    assert rows[0]["ratio_to_default"] == 1.0
    cell = dv.make_cell("B4-Lq33", sizing)
    rows = dv.run_cell(cell, 1, bg.wall_clock_ms, {}, torch.device("cpu"),
                       ("masked rows", "repeated rows", "flat documents", "loop per document",
                        "length order", "order given", "slots 8x16 by length",
                        "held block"))
    assert [r["variant"] for r in rows] == ["default", "masked rows", "repeated rows",
                                            "flat documents", "loop per document",
                                            "length order", "order given",
                                            "slots 8x16 by length", "held block",
                                            "validate=False"]


def test_each_round_starts_one_call_further_on(monkeypatch):
    """No call is always timed first: round r starts at the r-th call, in the same cycle, and
    the variants' rounds are timed so (the peers among them on a GPU)."""
    names = ["default", "masked rows", "validate=False"]
    assert [harness.round_order(names, r) for r in range(4)] == [
        names, ["masked rows", "validate=False", "default"],
        ["validate=False", "default", "masked rows"], names]
    assert harness.round_order([], 3) == []
    orders = []
    real = harness.round_order
    monkeypatch.setattr(harness, "round_order", lambda n, r: orders.append(real(n, r)) or orders[-1])
    dv.run_cell(dv.make_cell("headline", bg.Sizing(max_docs=3)), 3, bg.wall_clock_ms, {},
                torch.device("cpu"), ("masked rows",))
    assert [o[0] for o in orders] == names


def test_rounds_ms_times_every_call_once_a_round_in_round_order():
    timed = []
    calls = {"a": lambda: "a", "b": lambda: "b", "c": lambda: "c"}
    times = harness.rounds_ms(calls, 3, lambda fn: (timed.append(fn()) or len(timed), 0.0))
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert times == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}


def test_a_run_stopped_early_keeps_the_cells_it_finished(tmp_path, monkeypatch):
    """The results are written after every cell: a run killed in its second cell (a device
    call's time limit) leaves the first cell's rows."""
    real = dv.run_cell

    class Stopped(Exception):
        pass

    def run_cell(cell, *args, **kwargs):
        if cell.name != dv.make_cell("headline", bg.Sizing(max_docs=3)).name:
            raise Stopped
        return real(cell, *args, **kwargs)

    monkeypatch.setattr(dv, "run_cell", run_cell)
    with pytest.raises(Stopped):
        dv.main(["--cells", "headline", "d64", "--variants", "masked rows", "--rounds", "1",
                 "--max-docs", "3", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / f"{dv.SUITE}.json").read_text())
    assert doc["meta"]["cells_done"] == 1
    assert {r["variant"] for r in doc["rows"]} == {"default", "masked rows", "validate=False"}


def test_length_order_variants_switch_the_configs_and_restore_the_rule():
    configs = dense.default_config
    slots = configs(16, 16, None, 128, variable_lengths=True)
    full = configs(16, 32, None, 128, variable_lengths=True, num_docs=100_000)
    held = configs(16, 32, None, 128, True, 100_000, joins_tail=True)
    assert slots.slots and not slots.length_order and full.slots and held.hold_query
    with dv.VARIANTS["length order"]():
        assert dense.default_config(16, 16, None, 128, variable_lengths=True) == \
            dataclasses.replace(slots, length_order=True)
    with dv.VARIANTS["order given"]():
        assert dense.default_config(16, 32, None, 128, True, 100_000) == \
            dataclasses.replace(full, length_order=False)
    for name, docs, slot in (("slots 8x16 by length", 8, 16),):
        with dv.VARIANTS[name]():
            cfg = dense.default_config(16, 32, None, 128, True, 100_000)
            assert (cfg.slots, cfg.length_order, cfg.docs_per_program, cfg.block_t,
                    cfg.queries_per_block) == (True, True, docs, slot, full.queries_per_block)
            # A head holding its tail keeps the held block; one query is untouched.
            assert dense.default_config(16, 32, None, 128, True, 100_000, joins_tail=True) == held
            one = dense.default_config(1, 32, None, 128, variable_lengths=True)
            assert one == configs(1, 32, None, 128, variable_lengths=True)
    with dv.VARIANTS["held block"]():
        assert dense.default_config(16, 32, None, 128, True, 100_000) == held
        assert dense.default_config(1, 32, None, 128, True, 100_000) == \
            configs(1, 32, None, 128, True, 100_000)
    assert dense.default_config is configs
    assert set(dv.SEVERAL_QUERY_CELLS) <= set(dv.CELLS)


def test_tail_apart_scores_a_joined_tail_in_its_own_launch(monkeypatch):
    """B = 4, Lq = 48: the default holds the 16-token tail beside the 32-token head (one launch
    with tail_tokens); the switch makes it two launches, each without a tail, then restores the
    rule. Both score as the float64 reference."""
    monkeypatch.setattr(dense, "MANY_DOCS", 4)  # the held block's rule, at a CPU's size
    rule = dense.tail_joins_head
    assert rule(4, 32, 16, None, 128, True, 5, 2)
    tails = []
    real = dense._launch_kernel
    monkeypatch.setattr(dense, "_launch_kernel",
                        lambda *a, **k: tails.append(k.get("tail_tokens", 0)) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(4, 48, 128, generator=g).half()
    lengths = torch.tensor([3, 0, 17, 5, 140])  # one over 128: no single-tile launch
    offsets = torch.zeros(6, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    D = torch.randn(int(offsets[-1]), 128, generator=g).half()
    joined = dense.maxsim_packed(Q, D, offsets)
    with dv.VARIANTS["tail apart"]():
        assert not dense.tail_joins_head(4, 32, 16, None, 128, True, 5, 2)
        apart = dense.maxsim_packed(Q, D, offsets)
    assert dense.tail_joins_head is rule
    assert tails == [16, 0, 0]
    want = reference.maxsim_packed(Q, D, offsets)
    torch.testing.assert_close(joined.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(apart.double(), want, rtol=1e-4, atol=1e-4)


def test_bandwidth_variants_take_either_cards_default_and_restore_the_rule():
    """``held query`` takes the default as a card of any bandwidth does, ``slower card`` as one
    under dense.PER_DOCUMENT_MAX_BANDWIDTH does, whatever bandwidth the op passes."""
    config = dense.default_config
    wide = dense.MaxSimConfig(block_t=64, num_warps=4, num_stages=3, block_d=128)
    args = (1, 32, 300, 512, True, dense.MANY_DOCS)
    assert config(*args, mean_tokens=150.0) != wide  # no bandwidth known: the rule is off
    with dv.VARIANTS["slower card"]():
        assert dense.default_config(*args, mean_tokens=150.0) == wide
        assert dense.default_config(*args, mean_tokens=150.0, read_bandwidth=4.8e12) == wide
    with dv.VARIANTS["held query"]():
        assert dense.default_config(*args, mean_tokens=150.0, read_bandwidth=3.35e12) == \
            config(*args, mean_tokens=150.0)
    assert dense.default_config is config
