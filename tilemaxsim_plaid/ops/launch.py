"""Launch parameters that depend on the dtype and on where the kernels run."""

import os

import torch


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
