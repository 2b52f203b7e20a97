"""ops/launch.py: the outer layer every host function shares (the config check before the empty
cases, query chunks) and the config field rules."""

import dataclasses
import gc

import pytest
import torch

from tilemaxsim_plaid.ops import launch as launch_ops
from tilemaxsim_plaid.ops.launch import MAX_LQ_PER_LAUNCH, check_config_fields


@dataclasses.dataclass(frozen=True)
class Config:
    block_t: int = 16
    flag: bool = False


RULES = {"block_t": launch_ops.power_of_two(16), "flag": launch_ops.FLAG}


def check(config):
    check_config_fields(config, RULES)


@pytest.mark.parametrize("B,Lq,num_docs", [pytest.param(2, 4, 0, id="no-documents"),
                                           pytest.param(0, 4, 3, id="no-queries"),
                                           pytest.param(2, 0, 3, id="no-query-tokens"),
                                           pytest.param(2, 4, 3, id="one-launch")])
def test_config_checked_before_the_empty_cases(B, Lq, num_docs):
    launches = []

    def launch(Q, lengths):
        launches.append(Q.shape)
        return torch.zeros(Q.shape[0], num_docs)

    Q3 = torch.zeros(B, Lq, 8)
    with pytest.raises(ValueError, match=r"config.block_t must be a power of two >= 16, got 8"):
        launch_ops.launch_in_query_chunks(Q3, None, num_docs, launch, Config(block_t=8), check)
    with pytest.raises(ValueError, match=r"config.flag must be True or False, got 1"):
        launch_ops.launch_in_query_chunks(Q3, None, num_docs, launch, Config(flag=1), check)
    assert launches == []
    for config in (None, Config()):  # the op's default, and a valid config
        out = launch_ops.launch_in_query_chunks(Q3, None, num_docs, launch, config, check)
        assert out.shape == (B, num_docs)
    assert len(launches) == (2 if B and Lq and num_docs else 0)


def test_long_queries_in_chunks_checked_once():
    checked, launches = [], []

    def launch(Q, lengths):
        launches.append((Q.shape[1], lengths.tolist()))
        return torch.ones(Q.shape[0], 3)

    Lq = 2 * MAX_LQ_PER_LAUNCH + 5
    out = launch_ops.launch_in_query_chunks(torch.zeros(2, Lq, 8), torch.tensor([Lq, 130]), 3,
                                            launch, Config(), checked.append)
    assert checked == [Config()]
    assert launches == [(MAX_LQ_PER_LAUNCH, [MAX_LQ_PER_LAUNCH, MAX_LQ_PER_LAUNCH]),
                        (MAX_LQ_PER_LAUNCH, [MAX_LQ_PER_LAUNCH, 2]), (5, [5, 0])]
    assert torch.equal(out, torch.full((2, 3), 3.0))


def test_query_chunks_given_by_the_op():
    launches = []

    def launch(Q, lengths):
        launches.append((Q.shape[1], None if lengths is None else lengths.tolist()))
        return torch.full((Q.shape[0], 3), float(Q.shape[1]))

    out = launch_ops.launch_in_query_chunks(torch.zeros(2, 33, 8), torch.tensor([33, 20]), 3,
                                            launch, chunk_tokens=[32, 1])
    assert launches == [(32, [32, 20]), (1, [1, 0])]
    assert torch.equal(out, torch.full((2, 3), 33.0))
    for bad in ([32, 2], [16], [MAX_LQ_PER_LAUNCH + 1, -MAX_LQ_PER_LAUNCH + 32]):
        with pytest.raises(ValueError, match="query chunks"):
            launch_ops.launch_in_query_chunks(torch.zeros(2, 33, 8), None, 3, launch,
                                              chunk_tokens=bad)


@pytest.mark.parametrize("rule,good,bad", [
    (launch_ops.power_of_two(1), (1, 2, 64), (0, 3, -4, 2.0, True, None)),
    (launch_ops.power_of_two(16), (16, 128), (8, 24)),
    (launch_ops.at_least(1), (1, 3, 100), (0, -1, 1.5, False)),
    (launch_ops.one_of(("a", "b")), ("a", "b"), ("c", "", None)),
    (launch_ops.optional_range(24, 255), (None, 24, 255), (23, 256, 100.0)),
    (launch_ops.optional(launch_ops.power_of_two(16)), (None, 16, 64), (0, 8, 48)),
    (launch_ops.FLAG, (True, False), (None, 0, 1, "True")),
    (launch_ops.OPTIONAL_FLAG, (None, True, False), (0, "no")),
])
def test_field_rules(rule, good, bad):
    accepts, allowed = rule
    assert allowed and all(accepts(v) for v in good)
    assert not any(accepts(v) for v in bad)


def test_an_explicit_config_too_big_for_the_gpu_is_refused_naming_it():
    """Triton raises OutOfResources when it compiles a kernel the GPU cannot hold; with an
    explicit config that is the caller's choice and is refused as a ValueError naming it, with a
    default config it is a bug and passes through unchanged."""
    from triton.runtime.errors import OutOfResources

    def launch(Q, lengths):
        raise OutOfResources(442496, 232448, "shared memory")

    Q3 = torch.zeros(1, 4, 8)
    config = Config(block_t=128)
    with pytest.raises(ValueError, match=r"config .*block_t=128.* does not fit this GPU.*shared memory"):
        launch_ops.launch_in_query_chunks(Q3, None, 3, launch, config)
    with pytest.raises(OutOfResources):
        launch_ops.launch_in_query_chunks(Q3, None, 3, launch, None)


def test_host_cdiv_and_pow2_are_tritons():
    """The host helpers the launches size grids with give what triton.cdiv and
    triton.next_power_of_2 give (pow2 takes 1 for x <= 1, where a block needs one row)."""
    import triton

    for a in range(0, 300):
        for b in (1, 2, 3, 16, 64, 128):
            assert launch_ops.cdiv(a, b) == triton.cdiv(a, b)
    for a in (2**31 - 1, 2**31, 2**40 + 3):
        assert launch_ops.cdiv(a, 4096) == triton.cdiv(a, 4096)
        assert launch_ops.pow2(a) == triton.next_power_of_2(a)
    for x in range(1, 5000):
        assert launch_ops.pow2(x) == triton.next_power_of_2(x)
    assert launch_ops.pow2(0) == launch_ops.pow2(-3) == 1


def test_a_frozen_config_that_passed_is_remembered_by_identity_not_equality():
    """An equal config whose field has another type (1 == True) is checked on its own, a
    config is remembered only against the rules it passed, and a mutable one not at all."""
    good = Config(block_t=16, flag=True)
    check(good)
    assert launch_ops._passed_configs[id(good)][0]() is good
    same_values_wrong_type = Config(block_t=16, flag=1)
    assert same_values_wrong_type == good and hash(same_values_wrong_type) == hash(good)
    with pytest.raises(ValueError, match="config.flag must be True or False, got 1"):
        check(same_values_wrong_type)
    with pytest.raises(ValueError, match="config.block_t must be a power of two >= 32"):
        check_config_fields(good, {"block_t": launch_ops.power_of_two(32), "flag": launch_ops.FLAG})

    @dataclasses.dataclass
    class Mutable:
        block_t: int = 16
        flag: bool = False

    mutable = Mutable()
    check(mutable)
    assert id(mutable) not in launch_ops._passed_configs
    mutable.block_t = 12
    with pytest.raises(ValueError, match="config.block_t must be a power of two >= 16, got 12"):
        check(mutable)


def test_a_remembered_config_is_forgotten_with_it():
    config = Config(block_t=64)
    check(config)
    key = id(config)
    assert key in launch_ops._passed_configs
    del config
    gc.collect()
    assert key not in launch_ops._passed_configs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="reads a CUDA device's properties")
def test_memory_bandwidth_of_the_gpu_is_a_card_s():
    """The driver reports a memory clock and bus width: between a laptop card's 100 GB/s and
    20 TB/s (an H100 SXM reads 3.35 TB/s, an H200 4.8)."""
    bandwidth = launch_ops.memory_bandwidth(torch.device("cuda"))
    assert bandwidth is not None and 1e11 < bandwidth < 2e13
