"""The register-cap variants of bench_residual_scale (the timing itself needs a GPU)."""

from experiments.bench_residual_scale import cap_variants, op_default
from tilemaxsim_plaid.ops.residual import ResidualConfig, default_residual_config


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
    """Byte permutes serve nbits = 2 only; the op falls back to the pair table elsewhere, and so
    must the variants (an explicit decode='permute' is refused at nbits 1 and 4)."""
    assert op_default(2, 100_000, 2).decode == "permute"
    for nbits in (1, 4):
        config = op_default(nbits, 100_000, 2)
        assert config.decode == "pairs"
        assert all(c.decode == "pairs" for _, c in cap_variants(config, [0, 112]))
