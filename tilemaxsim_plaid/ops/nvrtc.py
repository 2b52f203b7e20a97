"""CUDA C++ kernels compiled at run time by NVRTC and launched through the driver API.

For the few kernels Triton cannot express (kernels/*.cu). Nothing is built at install time:
NVRTC ships with PyTorch's CUDA builds (the nvidia-cuda-nvrtc wheel), and the driver library
with the driver. A module is compiled once per (source, defines, architecture) and loaded once
per device.
"""

import ctypes
import glob
import os
import re
import sys
from functools import lru_cache
from pathlib import Path

import torch

_NVRTC_SUCCESS = 0
_CUDA_SUCCESS = 0
# cuda.h: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_NUM_REGS,
# CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES (spills land in local memory).
_CU_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_FUNC_NUM_REGS = 4
_CU_FUNC_LOCAL_SIZE_BYTES = 3


class NvrtcError(RuntimeError):
    """NVRTC is missing or rejected the source; the message carries its log."""


def _nvrtc_candidates() -> list[str]:
    names = []
    if torch.version.cuda:
        names.append(f"libnvrtc.so.{torch.version.cuda.split('.')[0]}")
    names += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    # pip's nvidia-cuda-nvrtc wheels (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib).
    for root in sys.path:
        names += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*")))
    return [n for n in names if "builtins" not in n and ".alt." not in n]


@lru_cache(maxsize=None)
def nvrtc_library() -> ctypes.CDLL:
    for name in _nvrtc_candidates():
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        # NVRTC opens libnvrtc-builtins by name at compile time; a wheel's copy sits beside
        # libnvrtc, off the loader's path, so load it first.
        for builtins in sorted(glob.glob(os.path.join(os.path.dirname(name),
                                                      "libnvrtc-builtins.so.*"))):
            if ".alt." not in builtins:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
        return library
    raise NvrtcError("NVRTC (libnvrtc.so) was not found: it comes with PyTorch's CUDA builds, "
                     "or `pip install nvidia-cuda-nvrtc`")


@lru_cache(maxsize=None)
def available() -> bool:
    """True when NVRTC can be loaded (a default that needs it falls back where it cannot)."""
    try:
        nvrtc_library()
    except NvrtcError:
        return False
    return True


def _check_nvrtc(lib, status: int, what: str, log: str = "") -> None:
    if status != _NVRTC_SUCCESS:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        reason = lib.nvrtcGetErrorString(status).decode()
        raise NvrtcError(f"{what} failed: {reason}" + (f"\n{log}" if log else ""))


def compile_cubin(source: str, name: str, arch: str, defines: dict | None = None,
                  options: tuple[str, ...] = (), headers: dict[str, str] | None = None
                  ) -> tuple[bytes, str]:
    """Compiles CUDA C++ ``source`` to a cubin for ``arch`` ("sm_90"); returns (cubin, log).

    ``defines`` become -D options. Raises NvrtcError with NVRTC's log when the source does not
    compile. Needs no GPU."""
    lib = nvrtc_library()
    program = ctypes.c_void_p()
    headers = headers or {}
    contents = (ctypes.c_char_p * len(headers))(*[text.encode() for text in headers.values()])
    names = (ctypes.c_char_p * len(headers))(*[key.encode() for key in headers])
    _check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(),
                                             name.encode(), len(headers), contents, names),
                 "nvrtcCreateProgram")
    try:
        args = [f"--gpu-architecture={arch}", "-std=c++17", *options]
        args += [f"-D{key}={value}" for key, value in (defines or {}).items()]
        argv = (ctypes.c_char_p * len(args))(*[a.encode() for a in args])
        status = lib.nvrtcCompileProgram(program, len(args), argv)
        log_size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(log_size))
        log_buffer = ctypes.create_string_buffer(log_size.value)
        lib.nvrtcGetProgramLog(program, log_buffer)
        log = log_buffer.value.decode(errors="replace")
        _check_nvrtc(lib, status, f"compiling {name} for {arch}", log)
        size = ctypes.c_size_t()
        _check_nvrtc(lib, lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib, lib.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return cubin.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


@lru_cache(maxsize=None)
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check_cuda(status: int, what: str) -> None:
    if status != _CUDA_SUCCESS:
        lib = _libcuda()
        text = ctypes.c_char_p()
        lib.cuGetErrorString(status, ctypes.byref(text))
        raise RuntimeError(f"{what} failed: CUresult {status} ({(text.value or b'').decode()})")


class CudaKernel:
    """One ``extern "C"`` kernel of a cubin, loaded on one device."""

    def __init__(self, cubin: bytes, name: str, device: torch.device, dynamic_shared: int = 0):
        lib = _libcuda()
        with torch.cuda.device(device):
            torch.cuda.current_stream(device).synchronize()  # makes the primary context current
            self._module = ctypes.c_void_p()
            _check_cuda(lib.cuModuleLoadData(ctypes.byref(self._module), cubin), "cuModuleLoadData")
            self._function = ctypes.c_void_p()
            _check_cuda(lib.cuModuleGetFunction(ctypes.byref(self._function), self._module,
                                                name.encode()), f"cuModuleGetFunction({name})")
            if dynamic_shared > 48 * 1024:
                _check_cuda(lib.cuFuncSetAttribute(self._function,
                                                   _CU_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   ctypes.c_int(dynamic_shared)),
                            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        self.name = name
        self.device = device
        self.dynamic_shared = dynamic_shared

    def attribute(self, attribute: int) -> int:
        value = ctypes.c_int()
        _check_cuda(_libcuda().cuFuncGetAttribute(ctypes.byref(value), attribute, self._function),
                    "cuFuncGetAttribute")
        return value.value

    @property
    def num_regs(self) -> int:
        return self.attribute(_CU_FUNC_NUM_REGS)

    @property
    def local_bytes(self) -> int:
        return self.attribute(_CU_FUNC_LOCAL_SIZE_BYTES)

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: list):
        """Launches on the current stream. ``args``: tensors (passed as pointers, None as a
        null pointer) and ctypes scalars, in the kernel's parameter order."""
        values = []
        for arg in args:
            if isinstance(arg, torch.Tensor):
                values.append(ctypes.c_void_p(arg.data_ptr()))
            elif arg is None:
                values.append(ctypes.c_void_p(0))
            else:
                values.append(arg)
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        stream = torch.cuda.current_stream(self.device).cuda_stream
        # The function belongs to its device's context, which must be current at launch (it
        # is when the device is torch's current one: the usual call, without a device switch).
        if torch.cuda.current_device() == self.device.index:
            self._launch(grid, block, stream, params)
        else:
            with torch.cuda.device(self.device):
                self._launch(grid, block, stream, params)

    def _launch(self, grid, block, stream, params) -> None:
        _check_cuda(_libcuda().cuLaunchKernel(
            self._function, *grid, *block, self.dynamic_shared, ctypes.c_void_p(stream),
            params, None), f"cuLaunchKernel({self.name})")


def local_headers(source: Path) -> dict[str, str]:
    """The files a CUDA source includes by ``#include "name"``, read from its folder (NVRTC is
    given them by name: it has no include path of ours)."""
    text = source.read_text()
    return {name: (source.parent / name).read_text()
            for name in re.findall(r'^#include "([^"]+)"', text, flags=re.MULTILINE)}


@lru_cache(maxsize=None)
def _cubin(source: Path, arch: str, defines: tuple) -> bytes:
    cubin, _ = compile_cubin(source.read_text(), source.name, arch, dict(defines),
                             headers=local_headers(source))
    return cubin


@lru_cache(maxsize=None)
def capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


@lru_cache(maxsize=None)
def multiprocessors(device: torch.device) -> int:
    """The device's SM count: the CUDA kernels launch one block per SM."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def load_kernel(source: Path, name: str, device: torch.device, defines: dict,
                dynamic_shared: int = 0) -> CudaKernel:
    """Kernel ``name`` of the CUDA file ``source`` with ``defines``, compiled for the device's
    architecture (once per source, architecture and defines) and loaded on ``device``. Callers
    cache the result per configuration: loading a module is not free."""
    major, minor = torch.cuda.get_device_capability(device)
    cubin = _cubin(source, f"sm_{major}{minor}", tuple(sorted(defines.items())))
    return CudaKernel(cubin, name, device, dynamic_shared=dynamic_shared)
