"""patches/colbert-ai-0.2.22.patch must still apply to the installed colbert-ai: upstream drift
(a new release, a local edit) shows up here rather than as a silently stale diff."""

from __future__ import annotations

import importlib.util
import pathlib
import py_compile
import shutil
import subprocess

import pytest

PATCH = pathlib.Path(__file__).resolve().parents[2] / "patches" / "colbert-ai-0.2.22.patch"

pytestmark = pytest.mark.colbert


def _site_packages() -> pathlib.Path:
    spec = importlib.util.find_spec("colbert")
    if spec is None or spec.origin is None:
        pytest.skip("colbert-ai is not installed (pip install .[colbert])")
    return pathlib.Path(spec.origin).parent.parent


def _patched_files() -> list[str]:
    return [line[len("+++ b/"):].strip() for line in PATCH.read_text().splitlines() if line.startswith("+++ b/")]


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")
def test_patch_applies_to_installed_colbert(tmp_path):
    site = _site_packages()
    files = _patched_files()
    assert "colbert/search/index_storage.py" in files and "colbert/modeling/hf_colbert.py" in files
    # Apply to a copy: the installed package is never touched, and the result must compile.
    for relative in files:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(site / relative, tmp_path / relative)
    result = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "-d", str(tmp_path), "-i", str(PATCH)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for relative in files:
        py_compile.compile(str(tmp_path / relative), doraise=True)
        assert "tilemaxsim_plaid" in (tmp_path / relative).read_text()
