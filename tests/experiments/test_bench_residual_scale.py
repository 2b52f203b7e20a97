"""The register-cap variants of bench_residual_scale (the timing itself needs a GPU)."""

from experiments.bench_residual_scale import cap_variants
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
