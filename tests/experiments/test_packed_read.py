"""The per-document read ceiling kernel (experiments/packed_read.py) must read every element of
every document, once: otherwise the ceiling it reports would be too high."""

from __future__ import annotations

import pytest
import torch

from experiments.packed_read import CONFIGS, expected_read, per_document_read


@pytest.mark.parametrize("block_t,num_warps,num_stages", [CONFIGS[0], CONFIGS[-1]])
@pytest.mark.parametrize("dim", [96, 128])
def test_sums_every_element_of_every_document(block_t, num_warps, num_stages, dim, device):
    lengths = torch.tensor([0, 1, 70, block_t, block_t + 1, 3 * block_t - 1, 0, 180])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    D = torch.randn(int(offsets[-1]), dim).half()
    got = per_document_read(D.to(device), offsets.to(device), block_t, num_warps, num_stages).cpu()
    expected = torch.stack([D[a:b].double().sum() for a, b in zip(offsets[:-1], offsets[1:])])
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-3)
    # expected_read, which the benchmarks check the kernel with, is the same sum.
    torch.testing.assert_close(expected_read(D, offsets).double(), expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("product", [False, True])
def test_query_variants(product, device):
    """With a query: its sum is added (it was loaded); with product, a bare MaxSim that equals
    the float64 reference on non-empty documents."""
    from tilemaxsim_plaid import reference

    lengths = torch.tensor([1, 70, 31, 33, 180, 5])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    D = (torch.randn(int(offsets[-1]), 96) / 10).half()
    Q = torch.nn.functional.normalize(torch.randn(32, 96), dim=-1).half()
    got = per_document_read(D.to(device), offsets.to(device), 32, 2, 2, query=Q.to(device),
                            product=product).cpu().double()
    if product:
        expected = reference.maxsim_packed(Q, D, offsets).double()
    else:
        expected = torch.stack([D[a:b].double().sum() for a, b in zip(offsets[:-1], offsets[1:])])
        expected += Q.double().sum()
        torch.testing.assert_close(expected_read(D, offsets, Q).double(), expected, rtol=1e-4,
                                   atol=1e-3)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


def test_rejects_what_it_cannot_read(device):
    with pytest.raises(ValueError, match="offsets must be int64"):
        per_document_read(torch.zeros(4, 8, device=device),
                          torch.tensor([0, 4], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="row-major"):
        per_document_read(torch.zeros(8, 4, device=device).t(), torch.tensor([0, 4], device=device))
    offsets = torch.tensor([0, 4], device=device)
    with pytest.raises(ValueError, match="needs a query"):
        per_document_read(torch.zeros(4, 8, device=device), offsets, product=True)
    with pytest.raises(ValueError, match="power of two"):
        per_document_read(torch.zeros(4, 8, device=device), offsets, query=torch.zeros(3, 8, device=device))


def test_bench_reports_the_fastest_configuration(monkeypatch, device):
    """experiments/bench.py's read_per_document row: every configuration checked against torch's
    per-document sums, the fastest one reported (timings stubbed: CUDA events need a GPU)."""
    from experiments import bench, harness

    case = bench.Case("1q packed tiny", 1, 32, 12, bench.LENGTH_MAX, 128, packed=True)
    x = bench.make_inputs(case, device=device)
    configs = bench.packed_read.CONFIGS
    fake_ms = {config: 1.0 + i for i, config in enumerate(configs)}
    fastest = bench.packed_read.CONFIGS[5]
    fake_ms[fastest] = 0.5
    timed = []

    def fake_time_ms(fn):
        config = configs[len(timed) % len(configs)]
        timed.append(config)
        return fake_ms[config], fake_ms[config], fake_ms[config]

    monkeypatch.setattr(harness, "time_ms", fake_time_ms)
    for variant in bench.PER_DOCUMENT_FLOORS:  # each variant's output is checked inside
        row = bench._per_document_read_row(case, x, x.doc_bytes, {"read_gbps": 4000.0}, variant)
        assert row["provider"] == variant and row["ms"] == 0.5
        assert (row["config"]["block_t"], row["config"]["num_warps"], row["config"]["num_stages"]) == fastest
        assert row["pct_read_bw"] == pytest.approx(100 * x.doc_bytes / 0.5 / 1e6 / 4000.0)
    assert timed == configs * len(bench.PER_DOCUMENT_FLOORS)
