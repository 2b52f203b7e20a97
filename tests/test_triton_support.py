"""The triton the kernels need (tilemaxsim_plaid.triton_support): an older one makes the kernels
refuse to import with a clear ImportError, the plugin serve with its torch path, and the PQ
kernel leave out the held query that triton 3.3 fails to compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tilemaxsim_plaid import triton_support

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("text, version", [("3.3.1", (3, 3)), ("3.4.0+git1a2b3c", (3, 4)),
                                           ("3.10.0rc1", (3, 10)), ("4", (4, 0))])
def test_parse_version(text, version):
    assert triton_support.parse_version(text) == version


def test_the_problem_names_the_version_needed(monkeypatch):
    monkeypatch.setattr(triton_support, "triton_version", lambda: (3, 2))
    problem = triton_support.triton_problem()
    assert "triton 3.2 is installed" in problem and ">= 3.3" in problem
    monkeypatch.setattr(triton_support, "triton_version", lambda: None)
    assert "not installed" in triton_support.triton_problem()
    monkeypatch.setattr(triton_support, "triton_version", lambda: triton_support.MIN_TRITON)
    assert triton_support.triton_problem() is None


def test_the_installed_triton_is_read_without_importing_it():
    code = textwrap.dedent("""
        import json, sys
        from tilemaxsim_plaid import triton_support
        version = triton_support.triton_version()
        print(json.dumps(dict(version=version, imported="triton" in sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True, timeout=300).stdout
    info = json.loads(out.strip().splitlines()[-1])
    import triton

    assert tuple(info["version"]) == triton_support.parse_version(triton.__version__)
    assert not info["imported"]


def test_an_older_triton_makes_the_kernels_refuse_and_the_plugin_serve_with_torch():
    code = textwrap.dedent("""
        import json
        from tilemaxsim_plaid import triton_support
        triton_support.triton_version = lambda: (3, 2)
        import tilemaxsim_plaid
        from tilemaxsim_plaid.plaid import environment
        try:
            tilemaxsim_plaid.maxsim_packed
            error = None
        except ImportError as exc:
            error = [exc.name, str(exc)]
        import torch
        print(json.dumps(dict(error=error,
                              backend=environment.backend_for(torch.device("cuda", 0)))))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TILEMAXSIM_PLAID_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True, timeout=300, env=env).stdout
    info = json.loads(out.strip().splitlines()[-1])
    name, message = info["error"]
    assert name == "triton"
    assert "triton 3.2 is installed and the kernels need triton >= 3.3" in message
    assert "torch path" in message
    assert info["backend"] == "torch"


def test_the_pq_kernel_holds_the_query_from_triton_34(monkeypatch):
    from tilemaxsim_plaid.ops import pq

    monkeypatch.setattr(pq, "triton_version", lambda: (3, 3))
    assert not pq._hold_query(1, torch.float16, 32, 128)
    monkeypatch.setattr(pq, "triton_version", lambda: pq.HOLD_QUERY_MIN_TRITON)
    assert pq._hold_query(1, torch.float16, 32, 128)
