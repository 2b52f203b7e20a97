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
    assert "colbert/modeling/checkpoint.py" in files
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


def test_every_runtime_target_is_in_the_diff_and_the_readme():
    """The diff and patches/README.md describe the same sites the runtime patch changes."""
    from tilemaxsim_plaid.plaid.targets import TARGETS

    files = set(_patched_files())
    readme = (PATCH.parent / "README.md").read_text()
    for target in TARGETS:
        module, _, owner_class = target.owner.partition(":")
        path = module.replace(".", "/") + ".py"
        assert path in files, f"{target.name}: {path} has no hunk in {PATCH.name}"
        assert f"`{path}`" in readme, f"{target.name}: {path} is not listed in patches/README.md"
        site = f"{owner_class}.{target.attribute}" if owner_class else target.attribute
        described = site in readme or (owner_class and f"{owner_class}.try_load_torch_extensions" in readme)
        assert described, f"{target.name} is not described in patches/README.md"
