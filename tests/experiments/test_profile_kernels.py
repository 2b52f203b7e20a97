"""experiments/profile_kernels.py: every op it times or profiles on the GPU passes its own output
check on a small index (CPU, interpreter), and a wrong output fails that check."""

import pytest

from experiments import profile_kernels


@pytest.mark.parametrize("make, sizes", [
    pytest.param(profile_kernels.dense_ops, {}, id="dense"),
    pytest.param(profile_kernels.wide_ops, {}, id="wide"),
    pytest.param(profile_kernels.residual_ops, {"num_centroids": 256}, id="residual"),
    pytest.param(profile_kernels.pq_ops, {"subquantizers": (16,)}, id="pq"),
])
def test_ops_pass_their_checks(make, sizes):
    ops = make(num_docs=12, device="cpu", **sizes)
    assert ops
    for name, (run, check) in ops.items():
        out = run()
        check(out)
        with pytest.raises(AssertionError):
            check(out * 1.01 + 1.0)  # 1 % and one unit off: the check must catch it


# ---- Nsight Compute (no GPU: a stand-in ncu that writes what the real one would) ----

SOURCE_HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)",'
                 '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed",'
                 '"stall_long_sb","stall_short_sb","stall_math"')


def _sass(address, text, samples, executed, long_sb, short_sb, math):
    return f'"{address}","{text}","{samples}","0","{executed}","{long_sb}","{short_sb}","{math}"'


SOURCE_CSV = "\n".join([
    '"Kernel Name","_maxsim_residual_kernel"',
    SOURCE_HEADER,
    _sass("0x7f0000000010", "LDG.E.64 R4, desc[UR4][R2.64]", 10, "1,000", 9, 0, 1),
    _sass("0x7f0000000020", "@!P0 LDS.64 R8, [R6]", 60, "2,000", 0, 55, 5),
    _sass("0x7f0000000030", "HMMA.16816.F32 R12, R16, R20, R12", 30, "4,000", 0, 0, 30),
    '"Kernel Name","maxsim_residual_mma"',
    SOURCE_HEADER,
    _sass("0x7f0000000110", "LDG.E R4, desc[UR4][R2.64]", 5, "100", 5, 0, 0),
])


def test_stall_table_ranks_instructions_and_reasons():
    blocks = profile_kernels.source_blocks(SOURCE_CSV)
    assert [len(rows) for _, rows in blocks] == [3, 1]
    assert blocks[0][0] == "Kernel Name _maxsim_residual_kernel"
    text = profile_kernels.stall_table("residual", blocks[0][1])
    lines = text.splitlines()
    assert lines[0] == "== residual: 100 warp-state samples, 3 instructions"
    assert lines[1] == "by opcode: LDS 60.0%, HMMA 30.0%, LDG 10.0%"  # the predicate skipped
    assert lines[2] == "by reason: short_sb 55.0%, math 36.0%, long_sb 9.0%"
    first = lines[4]  # the most sampled instruction first, with its leading reasons
    assert "60.0%" in first and "short_sb 55.0, math 5.0" in first and "LDS.64" in first
    assert "2,000" in first and lines[5].endswith("HMMA.16816.F32 R12, R16, R20, R12")
    assert "no warp-state samples" in profile_kernels.stall_table("x", [])


FAKE_NCU = r'''#!/usr/bin/env python3
import pathlib, sys
args = sys.argv[1:]
here = pathlib.Path(__file__).parent
if "--import" in args:
    page = args[args.index("--page") + 1]
    sys.stdout.write((here / f"{page}.csv").read_text())
    sys.exit(0)
(here / "argv.txt").write_text("\n".join(args))
report = args[args.index("-o") + 1]
pathlib.Path(report + ".ncu-rep").write_text("report")
out = pathlib.Path(args[args.index("--out") + 1])
(out / "profiled.json").write_text(
    '{"rows": [{"cell": "residual", "launches": 1}, {"cell": "residual decode", "launches": 1}]}')
'''


def test_ncu_mode_profiles_the_scoring_kernels_and_summarizes(tmp_path, capsys):
    from tests.experiments.test_profile_batched import NCU_CSV

    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text(FAKE_NCU)
    fake.chmod(0o755)
    (fake.parent / "details.csv").write_text(NCU_CSV)
    (fake.parent / "source.csv").write_text(SOURCE_CSV)
    out = tmp_path / "out"
    assert profile_kernels.main(["ncu", "--ncu", str(fake), "--ops", "residual",
                                 "--only", "=residual,residual decode", "--out", str(out)]) == 0
    argv = (fake.parent / "argv.txt").read_text().splitlines()
    assert argv[argv.index("-k") + 1] == profile_kernels.SCORING_KERNELS
    sections = [argv[i + 1] for i, a in enumerate(argv) if a == "--section"]
    assert sections == list(profile_kernels.NCU_SECTIONS) and "SourceCounters" in sections
    tail = argv[argv.index("experiments.profile_kernels") - 1:]
    assert tail == ["-m", "experiments.profile_kernels", "profile", "--out", str(out),
                    "--ops", "residual", "--only", "=residual,residual decode"]
    stalls = (out / "stalls.txt").read_text()
    assert stalls.startswith("== residual: 100 warp-state samples")  # labelled by entry
    assert "== residual decode: 5 warp-state samples" in stalls
    assert "by reason: long_sb 100.0%\n" in stalls  # reasons with no samples left out
    summary = (out / "ncu_summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary[2:5]] == ["residual", "residual", "?"]
    assert summary[3].startswith("residual decode") and "long_scoreboard 9.50" in summary[3]
    assert "the CSV has 3 launches, the launch map 2" in summary[-1]
    printed = capsys.readouterr().out
    assert "warp-state samples" in printed and "top stalls" in printed


def test_ncu_mode_without_a_report_fails(tmp_path):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    assert profile_kernels.main(["ncu", "--ncu", str(fake), "--out", str(tmp_path / "o")]) == 3
    assert not (tmp_path / "o" / "stalls.txt").exists()


def test_unknown_families_are_refused(capsys):
    with pytest.raises(SystemExit):
        profile_kernels.main(["time", "--ops", "residual,dens"])
    assert "unknown families ['dens']" in capsys.readouterr().err
