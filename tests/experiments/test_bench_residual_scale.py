"""The register-cap and decoder variants of bench_residual_scale (timing needs a GPU)."""

import pytest

from experiments.bench_residual_scale import (cap_variants, decoder_variants, mma_variants,
                                             op_default, pipelined_variants, scores_as_default)
from tilemaxsim_plaid.ops.residual import (MMA_DEFAULT, ResidualConfig, default_residual_config,
                                            mma_default)


def test_cap_variants_replace_only_the_cap_and_skip_the_defaults_own():
    default = default_residual_config(1, 32, False, 100_000, 2, half_table=True)
    assert default.maxnreg == 96
    variants = cap_variants(default, [0, 96, 112, 128, 112])
    assert [name for name, _ in variants] == [
        "maxsim_residual validate=False maxnreg=none",
        "maxsim_residual validate=False maxnreg=112",
        "maxsim_residual validate=False maxnreg=128"]
    for (_, config), cap in zip(variants, (None, 112, 128)):
        assert config == ResidualConfig(**{**vars(default), "maxnreg": cap})


def test_the_capped_launch_is_the_ops_own_at_every_nbits():
    """Byte permutes are the nbits = 2 and 4 default, the pair table nbits = 1's."""
    for nbits, decode in ((1, "pairs"), (2, "permute"), (4, "permute")):
        config = op_default(nbits, 100_000, 2)
        assert config.decode == decode
        assert all(c.decode == decode for _, c in cap_variants(config, [0, 112]))


def test_decoder_variants_skip_the_defaults_own_and_permute_at_nbits_1():
    for nbits, own, others in ((1, "pairs", ["select"]),
                               (2, "permute", ["pairs", "select"]),
                               (4, "permute", ["pairs", "select"])):
        default = op_default(nbits, 100_000, 2)
        assert default.decode == own
        variants = decoder_variants(default, ["pairs", "permute", "select", "pairs"], nbits)
        assert [c.decode for _, c in variants] == others
        assert all(ResidualConfig(**{**vars(c), "decode": own}) == default for _, c in variants)
        assert [name for name, _ in variants] == [
            f"maxsim_residual validate=False decode={d}" for d in others]


def test_pipelined_variants_twin_the_default_and_each_decoder():
    """Codes a tile ahead are the nbits 2 and 4 defaults (beside byte permutes), not nbits 1's
    (pairs); each twin flips only that."""
    for nbits, ahead in ((1, False), (2, True), (4, True)):
        default = op_default(nbits, 100_000, 2)
        assert default.pipeline_codes is ahead
        decoders = decoder_variants(default, ["pairs", "permute"], nbits)
        twins = pipelined_variants(default, decoders)
        assert [name for name, _ in twins] == [
            f"{name} pipeline_codes={not ahead}"
            for name in ["maxsim_residual validate=False"] + [n for n, _ in decoders]]
        for (_, twin), (_, base) in zip(twins, [("", default)] + decoders):
            assert twin == ResidualConfig(**{**vars(base), "pipeline_codes": not ahead})


def test_the_same_decoder_must_score_bit_for_bit_another_within_rounding():
    import torch

    want = torch.tensor([1.0, 2.0, float("-inf")])
    near = want + torch.tensor([1e-4, 0.0, 0.0])
    permute = op_default(2, 100_000, 2)
    twin = ResidualConfig(**{**vars(permute), "pipeline_codes": False, "maxnreg": 128})
    pairs = ResidualConfig(**{**vars(permute), "decode": "pairs"})
    assert scores_as_default(twin, permute, want.clone(), want)
    assert not scores_as_default(twin, permute, near, want)
    assert scores_as_default(pairs, permute, near, want)
    assert not scores_as_default(pairs, permute, want + 0.1, want)


@pytest.mark.parametrize("hinted", [False, True])
def test_mma_variants_are_the_mma_default_with_other_grabs(hinted):
    default = mma_default(hinted)
    grabs = [g for g in (1, 4, 8) if g != default.docs_per_program][:2]
    variants = mma_variants([grabs[0], default.docs_per_program, grabs[1], grabs[0]], default)
    assert [name for name, _ in variants] == [
        f"maxsim_residual validate=False scoring=mma grab={grabs[0]}",
        f"maxsim_residual validate=False scoring=mma grab={grabs[1]}",
        f"maxsim_residual validate=False scoring=mma prefetch={hinted}"]
    for (_, config), grab in zip(variants, grabs):
        assert config == ResidualConfig(**{**vars(default), "docs_per_program": grab})
    assert variants[-1][1] == ResidualConfig(**{**vars(MMA_DEFAULT), "prefetch": hinted})


def test_with_l2_hints_sets_the_override_for_the_call_only():
    from experiments.bench_residual_scale import with_l2_hints
    from tilemaxsim_plaid.ops import residual_mma

    before = residual_mma.L2_HINTS
    assert with_l2_hints(lambda: residual_mma.L2_HINTS, True)() is True
    assert with_l2_hints(lambda: residual_mma.L2_HINTS, False)() is False
    assert residual_mma.L2_HINTS is before
