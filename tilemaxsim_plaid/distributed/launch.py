"""Process-group start-up shared by the command line and the benchmark."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

__all__ = ["MULTICAST_OFF", "init_from_env"]

# NVLink multicast (NCCL's NVLS, PyTorch symmetric memory, NVSHMEM) stays off: on shared multi-GPU
# hosts a program using it can take the host's GPUs out of service, and ring all-gathers of a few
# KiB of top-k keys gain nothing from it. Set before NCCL initialises, unless the caller chose.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_from_env(backend: str = "auto") -> tuple[torch.device, bool]:
    """Join (or start) the default process group the way ``torchrun`` describes it.

    Without ``RANK``/``WORLD_SIZE`` in the environment (a plain ``python -m`` run) this starts a
    world of one process on localhost, so the same code path serves one GPU and many.

    Args:
        backend: ``"nccl"``, ``"gloo"`` or ``"auto"`` (NCCL when CUDA is available, else gloo).

    Returns:
        (this rank's device, whether this call created the group and should destroy it).
    """
    for name, value in MULTICAST_OFF.items():
        os.environ.setdefault(name, value)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl', 'gloo' or 'auto', got {backend!r}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return device, False
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    dist.init_process_group(backend=backend)
    return device, True
