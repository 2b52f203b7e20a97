"""The tiny index is cached under a key of what it is built from (tests/fixtures_plaid.py)."""

from __future__ import annotations

from tests import fixtures_plaid


def test_key_is_stable_and_follows_the_parameters(monkeypatch):
    key = fixtures_plaid.build_key()
    assert fixtures_plaid.build_key() == key and len(key) == 16
    monkeypatch.setattr(fixtures_plaid, "TINY_NBITS", 4)
    assert fixtures_plaid.build_key() != key


def test_key_follows_package_versions(monkeypatch):
    key = fixtures_plaid.build_key()
    real = fixtures_plaid._version
    monkeypatch.setattr(fixtures_plaid, "_version",
                        lambda package: "0.0.0" if package == "faiss-cpu" else real(package))
    assert fixtures_plaid.build_key() != key


def test_cached_build_is_reused(tiny_plaid_index):
    root = fixtures_plaid.pathlib.Path(tiny_plaid_index.index_root).parent
    assert root.name == fixtures_plaid.build_key()
    assert (root / "COMPLETE").read_text() == root.name
