"""Launch parameters that depend on the dtype and on where the kernels run."""

import os

import torch
import triton


# fp32 inputs: plain tf32 would drop ~3 significant digits, and exactness is the point of this
# scorer. "tf32x3" splits each operand into a tf32 head and tail and sums three tensor-core
# products (head*head + head*tail + tail*head): a relative error near 1e-6 per product, the order
# of fp32 accumulation itself, at tensor-core speed. "ieee" (FMA on the CUDA cores) is several
# times slower and no more useful for ranking.
FP32_INPUT_PRECISION = "tf32x3"


def dot_precision(dtype: torch.dtype) -> str:
    # fp16/bf16 products are exact in fp32 either way.
    return FP32_INPUT_PRECISION if dtype == torch.float32 else "tf32"


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def interpreter_upcast(dtype: torch.dtype) -> bool:
    """True when tile_dot must multiply in fp32 (bf16 under TRITON_INTERPRET=1, see tile_dot)."""
    return dtype == torch.bfloat16 and interpreting()


# A buffer added past Triton's own shared memory starts at a multiple of this many bytes (also a
# multiple of 16, so the kernel's offset argument specializes the same way for every value).
SHARED_BUFFER_ALIGN = 128
# cuFuncSetAttribute's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (cuda.h).
_CU_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# Shared memory the driver reserves per resident block on sm_80 and later.
_SHARED_RESERVED_PER_BLOCK = 1024


def _set_max_dynamic_shared(function: int, num_bytes: int) -> None:
    import ctypes
    libcuda = ctypes.CDLL("libcuda.so.1")
    status = libcuda.cuFuncSetAttribute(ctypes.c_void_p(function),
                                        _CU_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        ctypes.c_int(num_bytes))
    if status != 0:
        raise RuntimeError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {num_bytes}) "
                           f"failed with CUresult {status}")


def prepare_shared_buffer(kernel, buffer_bytes: int, offset_name: str, *args, **kwargs):
    """Compiles ``kernel(*args, **kwargs)`` (a Triton JIT function) and sets its launches up to
    carry ``buffer_bytes`` of dynamic shared memory past Triton's own buffers.

    Triton sizes a launch's shared memory from its own allocation, and Triton code cannot
    allocate a buffer it indexes at run-time addresses; a kernel that keeps, say, a codebook in
    shared memory addresses it by inline PTX at ``global_smem + <offset_name>``. This compiles
    the kernel (the offset argument's value does not change the specialization), places the
    buffer past Triton's buffers and makes every later launch of that compiled kernel reserve
    it. Only of that one: a launch whose arguments specialize otherwise (an int equal to 1 or
    divisible by 16 where these were not) compiles a kernel of its own that reserves nothing,
    and its buffer accesses run past the launch's shared memory. Pass the launch's own
    arguments, or mark those that may differ do_not_specialize (kernels/maxsim_pq_warps.py).
    Uses CompiledKernel.packed_metadata and .function (triton 3.x).

    Returns (offset, blocks per SM that fit by shared memory); launch with
    ``offset_name=offset``.
    """
    kwargs[offset_name] = SHARED_BUFFER_ALIGN
    compiled = kernel.warmup(*args, grid=(1,), **kwargs)
    if hasattr(compiled, "result"):
        compiled = compiled.result()
    own = compiled.metadata.shared
    offset = triton.cdiv(own, SHARED_BUFFER_ALIGN) * SHARED_BUFFER_ALIGN
    total = offset + buffer_bytes
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if total > props.shared_memory_per_block_optin:
        raise ValueError(f"a {buffer_bytes}-byte shared-memory buffer past the kernel's own "
                         f"{own} bytes exceeds the {props.shared_memory_per_block_optin} bytes a "
                         f"block may use on {props.name}")
    if compiled.packed_metadata[2] != total:
        _ = compiled.run  # loads the module: compiled.function
        _set_max_dynamic_shared(compiled.function, total)
        num_warps, num_ctas, _ = compiled.packed_metadata
        compiled.packed_metadata = (num_warps, num_ctas, total)
    per_sm = props.shared_memory_per_multiprocessor // (total + _SHARED_RESERVED_PER_BLOCK)
    return offset, max(1, per_sm)


# persistent=True launches this many programs per SM (the most a Hopper SM holds at once);
# those that find the counter exhausted exit at once.
PERSISTENT_PROGRAMS_PER_SM = 32


def persistent_programs(device: torch.device) -> int:
    """Programs of a persistent launch: PERSISTENT_PROGRAMS_PER_SM per SM; in the CPU
    interpreter two, so that each walks several chunks."""
    if device.type != "cuda":
        return 2
    return PERSISTENT_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def document_grid(cfg, num_chunks: int, num_qblocks: int, queries_per_block: int,
                  num_queries: int, device: torch.device):
    """(programs, counter) of a launch over chunks of documents: one program per (chunk, query
    block), or with ``cfg.persistent`` a fixed grid and the int32 counter its programs take
    chunks from (None without). Persistent programs hold one query block."""
    if not cfg.persistent:
        return num_chunks * num_qblocks, None
    if num_qblocks != 1:
        raise ValueError(f"config.persistent needs one query block, got {num_qblocks} "
                         f"(B={num_queries} queries, {queries_per_block} per block)")
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    return min(num_chunks, persistent_programs(device)), counter


# Query tokens per launch are padded to a power of two in registers (tl.arange needs one); longer
# queries are scored in chunks of this many tokens and the chunk scores summed: a [128, BLOCK_T]
# fp32 block of running maxima is as much as registers hold comfortably.
MAX_LQ_PER_LAUNCH = 128


def launch_in_query_chunks(Q3: torch.Tensor, query_lengths, num_out_docs: int, launch):
    """Shared outer layer of every MaxSim host function.

    Handles the empty cases (no documents or no queries: an empty [B, M]; no query tokens: zeros,
    the empty sum) and splits queries longer than MAX_LQ_PER_LAUNCH into chunks of query tokens.
    Each chunk is exact MaxSim over its own tokens and the sum over tokens is associative, so the
    chunk scores add up to the whole.

    Args:
        Q3: [B, Lq, d] queries.
        query_lengths: optional [B] lengths.
        num_out_docs: M, documents scored.
        launch: ``launch(Q_chunk, chunk_lengths) -> fp32 [B, M]`` for Lq <= MAX_LQ_PER_LAUNCH.
    """
    B, Lq, _ = Q3.shape
    if num_out_docs == 0 or B == 0:
        return torch.empty(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    if Lq == 0:
        return torch.zeros(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    if Lq <= MAX_LQ_PER_LAUNCH:
        return launch(Q3, query_lengths)
    out = torch.zeros(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    for start in range(0, Lq, MAX_LQ_PER_LAUNCH):
        chunk = Q3[:, start:start + MAX_LQ_PER_LAUNCH]
        chunk_lengths = None
        if query_lengths is not None:
            chunk_lengths = (query_lengths - start).clamp(0, chunk.shape[1])
        out += launch(chunk, chunk_lengths)
    return out
