"""The static instruction budget: launch capture, sm_90a compile, SASS parsing, bound arithmetic.

The capture and the compile run in a subprocess without TRITON_INTERPRET (tests/conftest.py sets
it without a GPU; under it @triton.jit builds no JITFunction and host code takes its interpreter
choices); they need triton's bundled ptxas, which CI's triton wheel carries too.
"""

import textwrap

import pytest
import torch

from experiments import sass_budget as sb
from tests.conftest import compiled_mode_json

# Launch capture and compile of the dense launch and the nbits = 2 residual launch, as JSON.
_CAPTURE = textwrap.dedent("""
    import json, sys
    from experiments import sass_budget as sb
    launches = sb.benchmark_launches((2,))
    out = {}
    for name, launch in launches.items():
        # JITFunction.run was never entered: it would have built a per-device binder.
        ran = len(launch.kernel.device_caches) != 0
        compiled = sb.compile_launch(launch)
        out[name] = {"kernel": launch.kernel.fn.__name__, "constexprs": launch.constexprs,
                     "options": launch.options, "grid": list(launch.grid), "ran": ran,
                     "registers": compiled.registers, "sass": sb.sass_text(compiled.cubin)}
    json.dump(out, open(sys.argv[1], "w"))
""")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return compiled_mode_json(_CAPTURE, tmp_path_factory, timeout=240)


def test_capture_records_the_benchmark_launches_without_running_them(captured):
    dense, residual = captured["dense"], captured["residual nbits=2"]
    assert not dense["ran"] and not residual["ran"]
    assert dense["kernel"] == "_maxsim_dense_kernel"
    # default_config for one query over MANY_DOCS packed fp16 documents: the held query.
    assert dense["constexprs"]["HOLD_QUERY"] and dense["constexprs"]["PACKED"]
    assert dense["constexprs"]["BLOCK_T"] == 16 and dense["constexprs"]["LQ"] == 32
    assert dense["options"] == {"num_warps": 1, "num_stages": 3}
    assert residual["kernel"] == "_maxsim_residual_kernel"
    # default_residual_config at MANY_DOCS with an fp16 query and table: a persistent grid of
    # one-warp programs, the byte-permute decoder, the fp16 table with prefetch, compiled PTX.
    c = residual["constexprs"]
    assert (c["NBITS"], c["DECODE_GROUP"], c["UNIT_BYTES"]) == (2, 0, 4)
    assert c["PERSISTENT"] and c["CENTROID_TABLE"] and c["PRECOMPUTED_NORMS"] and c["PTX_LOADS"]
    assert c["PREFETCH"] == 1 and c["DOCS_PER_PROGRAM"] == 2 and c["PIPELINE_CODES"]
    assert residual["options"] == {"num_warps": 1, "num_stages": 1, "maxnreg": 96}


def test_compile_gives_tensor_core_loops(captured):
    for name, roles in (("dense", 1), ("residual nbits=2", 2)):
        instrs = sb.parse_sass(captured[name]["sass"])
        assert any(i.opcode == "HMMA" for i in instrs), name
        assert any(loop.end > loop.start for loop in sb.find_loops(instrs)), name
        hot = sb.hot_loops(instrs)
        assert len(hot) == roles, name
        # One 16-token tile against 32 query rows at d = 128: 32 HMMA.16816 per iteration.
        for loop in hot:
            assert sum(i.opcode == "HMMA" for i in loop.body(instrs)) == 32, name
        assert sb.document_loop(instrs, hot) is not None, name
    assert captured["residual nbits=2"]["registers"] <= 96


# A hand-made cuobjdump excerpt: an outer loop 0x0100..0x01b0 around a tensor-core loop
# 0x0130..0x0180, a loop without tensor instructions 0x01c0..0x01e0, and the self-branch after
# EXIT that pads every kernel.
SASS_SNIPPET = """
    Function : _toy_kernel
    /*0100*/ IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ; /* 0x00000a00ff017624 */
    /*0110*/ S2R R0, SR_TID.X ;
    /*0120*/ LDG.E R2, desc[UR4][R4.64] ;
    /*0130*/ HMMA.16816.F32 R8, R12, R16, R8 ;
    /*0140*/ SHF.R.U32.HI R3, RZ, 0x6, R2 ;
    /*0150*/ LOP3.LUT R3, R3, 0x3030303, RZ, 0xc0, !PT ;
    /*0160*/ PRMT R5, R6, R3, R7 ;
    /*0170*/ FMNMX.NAN R9, R9, R8, !PT ;
    /*0180*/ @!P0 BRA 0x130 ;
    /*0190*/ SHFL.BFLY PT, R10, R9, 0x1, 0x1f ;
    /*01a0*/ STG.E desc[UR4][R4.64], R10 ;
    /*01b0*/ @P1 BRA 0x100 ;
    /*01c0*/ FADD R11, R11, 1 ;
    /*01d0*/ @UP0 IADD3 R12, R12, 0x1, RZ ;
    /*01e0*/ @P2 BRA 0x1c0 ;
    /*01f0*/ EXIT ;
    /*0200*/ BRA 0x200;
"""


def test_parser_counts_classes_and_finds_the_loop():
    instrs = sb.parse_sass(SASS_SNIPPET)
    assert len(instrs) == 17
    assert instrs[3].opcode == "HMMA" and instrs[8].branch_target == 0x130
    assert [(l.start, l.end) for l in sb.find_loops(instrs)] == [
        (0x100, 0x1b0), (0x130, 0x180), (0x1c0, 0x1e0)]
    hot = sb.hot_loops(instrs)
    assert [(l.start, l.end) for l in hot] == [(0x130, 0x180)]
    assert sb.document_loop(instrs, hot) == sb.Loop(0x100, 0x1b0)
    assert sb.class_counts(hot[0].body(instrs)) == {
        "tensor": 1, "memory": 0, "int": 3, "fp": 1, "control": 1, "other": 0}
    assert sb.class_counts(instrs)["other"] == 1  # SHFL
    budget = sb.loop_budget(hot[0].body(instrs), num_warps=2, tokens=16, dim=128, query_rows=32)
    assert budget["warp_instructions"] == 12
    assert budget["per_token"] == 12 / 16
    assert budget["per_element"] == 12 / (16 * 128)
    assert budget["per_product"] == 12 / (16 * 32)
    assert budget["by_opcode"]["PRMT"] == 1


@pytest.mark.parametrize("lengths, block_t, tail, want", [
    pytest.param([70, 16, 15, 0, 33], 16, 16, {"main": 7, "tail": 3}, id="16+16"),
    pytest.param([70, 16, 15, 0, 33], 16, None, {"main": 10, "tail": 0}, id="dense-ceil"),
    pytest.param([70, 130], 64, 32, {"main": 3, "tail": 2}, id="64+32"),
])
def test_tile_walk(lengths, block_t, tail, want):
    assert sb.tile_walk(torch.tensor(lengths), block_t, tail) == want


def test_bounds_arithmetic():
    b = sb.bounds({"main": 300, "tail": 400}, {"main": 1000, "tail": 100},
                  {"main": 32, "tail": 32}, per_document=250, num_docs=200, hbm_bytes=1e6,
                  read_gbps=1000.0, sms=2, schedulers=4, clock_hz=1e9, hmma_per_sm_cycle=0.5)
    # 300 * 1000 + 400 * 100 + 250 * 200 = 390,000 warp instructions over 8 issue slots per ns.
    assert b["warp_instructions"] == 390_000
    assert b["issue_us"] == pytest.approx(48.75)
    # 32 * 1100 = 35,200 HMMA at 1 per ns (2 SMs x 0.5).
    assert b["hmma"] == 35_200 and b["tensor_us"] == pytest.approx(35.2)
    assert b["bytes_us"] == pytest.approx(1.0)
    assert b["dominant"] == "issue" and b["floor_us"] == pytest.approx(48.75)


def test_targets_against_floors():
    t = sb.targets(0.450, {2: 167.3, 4: 500.0})
    assert t[2]["needed_us"] == pytest.approx(450 / 1.3) and t[2]["reachable"]
    assert t[2]["margin"] == pytest.approx(450 / 1.3 / 167.3)
    assert t[4]["needed_us"] == pytest.approx(450 / 1.1) and not t[4]["reachable"]
    assert t[4]["margin"] == pytest.approx(450 / 1.1 / 500.0)


def test_config_override_parses_a_residual_field_and_refuses_others():
    import argparse

    assert sb.config_override("pipeline_codes=True") == ("pipeline_codes", True)
    assert sb.config_override("maxnreg=128") == ("maxnreg", 128)
    assert sb.config_override("decode='permute'") == ("decode", "permute")
    for bad in ("pipeline_codes", "warps=1", "maxnreg=lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            sb.config_override(bad)
