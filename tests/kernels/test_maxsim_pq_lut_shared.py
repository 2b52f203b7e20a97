"""PQ lookup tables in shared memory (kernels/maxsim_pq_lut_shared.cu, PQConfig.lut_shared).

Its scores are checked against the float64 reference in tests/kernels/test_maxsim_pq.py
(test_lookup_tables_match_the_reference runs it on a GPU wherever a tile's table fits, beside
the Triton kernel); here: the source compiles, and the kernel keeps its registers.
"""

import pytest
import torch

from tests.conftest import ON_GPU
from tests.kernels.test_maxsim_pq import random_pq_index, split, unit_queries
from tests.tolerances import assert_close
from tilemaxsim_plaid import reference
from tilemaxsim_plaid.ops import nvrtc, pq_lut_shared
from tilemaxsim_plaid.ops.pq import PQConfig, maxsim_pq


def test_kernel_source_compiles_for_sm90():
    for rows in (4, 8, 16, 32):
        for code_words in (0, 1):
            cubin, _ = nvrtc.compile_cubin(pq_lut_shared.SOURCE.read_text(),
                                           pq_lut_shared.SOURCE.name, "sm_90",
                                           {"ROWS": rows, "WARPS": pq_lut_shared.WARPS,
                                            "CODE_WORDS": code_words})
            assert cubin[:4] == b"\x7fELF"


def test_table_bytes():
    assert pq_lut_shared.table_bytes(16, 8) == 128 * 1024


@pytest.mark.skipif(not ON_GPU, reason="the CUDA kernel needs a GPU")
@pytest.mark.parametrize("rows", [4, 8])
def test_kernel_keeps_its_registers(device, rows):
    kernel = pq_lut_shared.kernel(device, rows, True, pq_lut_shared.table_bytes(16, rows))
    assert kernel.local_bytes == 0


@pytest.mark.skipif(not ON_GPU, reason="the CUDA kernel needs a GPU")
def test_many_documents_in_shared_memory_equal_the_reference(device):
    """Enough documents that every block takes several grabs, M = 16 and 32 (4 rows)."""
    lengths = torch.randint(0, 140, (3000,)).tolist()
    for num_subquantizers, rows in ((16, 8), (32, 4)):
        index = random_pq_index(device, 128, num_subquantizers, lengths=lengths)
        args, _ = split(index)
        Q = unit_queries(2, 32, 128, torch.float16, device)
        config = PQConfig(scoring="lut", lut_rows=rows, lut_shared=True)
        out = maxsim_pq(Q, *args, config=config)
        assert_close(out, reference.maxsim_pq(Q, *args), "maxsim_pq", torch.float32)
