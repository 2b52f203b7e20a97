"""Launch parameters that depend on the dtype and on where the kernels run, the rules a launch
configuration's fields obey, and the outer layer every MaxSim host function shares."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence

import torch

from tilemaxsim_plaid.triton_support import interpreting

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # no triton: no kernel is ever launched, nothing to catch
    OutOfResources = ()


# fp32 inputs: plain tf32 would drop ~3 significant digits, and exactness is the point of this
# scorer. "tf32x3" splits each operand into a tf32 head and tail and sums three tensor-core
# products (head*head + head*tail + tail*head): a relative error near 1e-6 per product, the order
# of fp32 accumulation itself, at tensor-core speed. "ieee" (FMA on the CUDA cores) is several
# times slower and no more useful for ranking.
FP32_INPUT_PRECISION = "tf32x3"


def dot_precision(dtype: torch.dtype) -> str:
    # fp16/bf16 products are exact in fp32 either way.
    return FP32_INPUT_PRECISION if dtype == torch.float32 else "tf32"


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of ints on the host. triton.cdiv and triton.next_power_of_2 are
    constexpr_functions, whose host calls cost microseconds each, about ten per launch
    (results/host/cpu-stubbed-launches)."""
    return -(-a // b)


def pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1), on the host (see :func:`cdiv`)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()




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


def memory_bandwidth(device: torch.device) -> float | None:
    """Peak DRAM bytes per second of a CUDA device: two transfers a memory clock over its bus
    (the driver's memory clock and bus width, as torch reports them); None on the CPU or where
    torch reports neither. It decides one query's held or per-document tiles
    (ops/dense.PER_DOCUMENT_MAX_BANDWIDTH)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _memory_bandwidth(index)


@functools.lru_cache(maxsize=None)
def _memory_bandwidth(index: int) -> float | None:
    props = torch.cuda.get_device_properties(index)
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz > 0 and bus_bits > 0 else None


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


# A rule for one field of a launch configuration: (accepts(value), what it accepts, in words).
FieldRule = tuple[Callable[[object], bool], str]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def power_of_two(minimum: int = 1) -> FieldRule:
    """An int power of two >= minimum: a tl.arange extent (>= 16 where it is a tl.dot one)."""
    return (lambda v: _is_int(v) and v >= minimum and v & (v - 1) == 0,
            f"a power of two >= {minimum}")


def at_least(minimum: int) -> FieldRule:
    return lambda v: _is_int(v) and v >= minimum, f"an integer >= {minimum}"


def one_of(values) -> FieldRule:
    values = tuple(values)
    return lambda v: v in values, f"one of {values}"


def optional(rule: FieldRule) -> FieldRule:
    """None (the op's choice), or what ``rule`` accepts."""
    accepts, allowed = rule
    return lambda v: v is None or accepts(v), f"None or {allowed}"


def optional_range(low: int, high: int) -> FieldRule:
    return optional((lambda v: _is_int(v) and low <= v <= high, f"an integer in [{low}, {high}]"))


FLAG: FieldRule = (lambda v: isinstance(v, bool), "True or False")
OPTIONAL_FLAG: FieldRule = (lambda v: v is None or isinstance(v, bool), "None, True or False")
# Triton's own rules for its launch parameters: the compiler asserts num_warps is a power of two
# (on a GPU only: the interpreter ignores both); one stage is no software pipelining.
NUM_WARPS: FieldRule = power_of_two(1)
NUM_STAGES: FieldRule = at_least(1)


# Frozen configs whose fields passed a set of rules, by identity: id -> (weak reference, rules).
# A frozen dataclass cannot change after its check, so an op's default, passed on every call,
# is checked once. Not by equality: 1 == True would let a field its rule refuses through.
_passed_configs: dict[int, tuple[weakref.ref, Mapping]] = {}


def check_config_fields(config, rules: Mapping[str, FieldRule]) -> None:
    """A ValueError naming the first field of ``config`` that its rule refuses, with what the
    rule accepts. ``rules`` holds one rule per field of the config class. A frozen dataclass
    that passed is remembered (``_passed_configs``) and not checked again."""
    key = id(config)
    entry = _passed_configs.get(key)
    if entry is not None and entry[0]() is config and entry[1] is rules:
        return
    for name, (accepts, allowed) in rules.items():
        value = getattr(config, name)
        if not accepts(value):
            raise ValueError(f"config.{name} must be {allowed}, got {value!r}")
    params = getattr(type(config), "__dataclass_params__", None)
    if params is not None and params.frozen:
        try:
            ref = weakref.ref(config, lambda _, key=key: _passed_configs.pop(key, None))
        except TypeError:  # a class with __slots__ and no __weakref__: checked every time
            return
        _passed_configs[key] = (ref, rules)


def launch_in_query_chunks(Q3: torch.Tensor, query_lengths, num_out_docs: int, launch,
                           config=None, check_config: Callable[[object], None] | None = None,
                           chunk_tokens: Sequence[int] | None = None):
    """Shared outer layer of every MaxSim host function.

    First ``check_config(config)`` where both are given, so that a malformed config is refused
    whatever the input, also when there is nothing to score. Then the empty cases (no documents
    or no queries: an empty [B, M]; no query tokens: zeros, the empty sum), and queries longer
    than MAX_LQ_PER_LAUNCH split into chunks of query tokens. Each chunk is exact MaxSim over its
    own tokens and the sum over tokens is associative, so the chunk scores add up to the whole.
    An explicit config too big for this GPU is refused with a ValueError (:func:`_does_not_fit`).

    Args:
        Q3: [B, Lq, d] queries.
        query_lengths: optional [B] lengths.
        num_out_docs: M, documents scored.
        launch: ``launch(Q_chunk, chunk_lengths) -> fp32 [B, M]`` for Lq <= MAX_LQ_PER_LAUNCH.
        config: the caller's launch configuration, or None (the op's default, valid by
            construction).
        check_config: the op's check of a config's own fields (no input needed); raises
            ValueError naming the config.
        chunk_tokens: query tokens per launch (summing to Lq, each <= MAX_LQ_PER_LAUNCH),
            where the op splits a query that fits one launch; None: MAX_LQ_PER_LAUNCH each.
    """
    if config is not None and check_config is not None:
        check_config(config)
    try:
        return _launch_chunks(Q3, query_lengths, num_out_docs, launch, chunk_tokens)
    except OutOfResources as err:
        if config is None:
            raise
        raise _does_not_fit(config, err) from err


def _does_not_fit(config, err) -> ValueError:
    """The refusal of an explicit config whose kernel needs more shared memory (or registers)
    than this GPU has; which configs fit depends on the GPU, so this is known only when Triton
    compiles for it. A default config that does not fit is a bug: its error passes through
    unchanged."""
    return ValueError(f"config {config} does not fit this GPU ({err}); smaller tiles "
                      f"(block_t, queries_per_block, docs_per_program) or fewer num_stages do")


def _launch_chunks(Q3: torch.Tensor, query_lengths, num_out_docs: int, launch, chunk_tokens=None):
    B, Lq, _ = Q3.shape
    if num_out_docs == 0 or B == 0:
        return torch.empty(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    if Lq == 0:
        return torch.zeros(B, num_out_docs, dtype=torch.float32, device=Q3.device)
    if chunk_tokens is None:
        if Lq <= MAX_LQ_PER_LAUNCH:
            return launch(Q3, query_lengths)
        chunk_tokens = [MAX_LQ_PER_LAUNCH] * (Lq // MAX_LQ_PER_LAUNCH) + [Lq % MAX_LQ_PER_LAUNCH]
    chunk_tokens = [n for n in chunk_tokens if n]
    if sum(chunk_tokens) != Lq or max(chunk_tokens) > MAX_LQ_PER_LAUNCH:
        raise ValueError(f"query chunks {chunk_tokens} must sum to Lq = {Lq}, each at most "
                         f"{MAX_LQ_PER_LAUNCH} tokens")
    out = None
    start = 0
    for size in chunk_tokens:
        chunk = Q3[:, start:start + size]
        chunk_lengths = None
        if query_lengths is not None:
            chunk_lengths = (query_lengths - start).clamp(0, size)
        scores = launch(chunk, chunk_lengths)
        out = scores if out is None else out.add_(scores)
        start += size
    return out


class _NoBackward(torch.autograd.Function):
    """The scores of an op whose inputs require grad: a node that refuses the backward pass."""

    @staticmethod
    def forward(ctx, op_name: str, scores: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.op_name = op_name
        return scores.view_as(scores)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(
            f"{ctx.op_name} has no backward: the kernels score without a gradient. For "
            f"inference, call it under torch.no_grad() or torch.inference_mode() (or detach the "
            f"inputs); to train, score with torch ops, e.g. tilemaxsim_plaid.reference.{ctx.op_name}")


def scoring_op(op: Callable) -> Callable:
    """The public ops' outer layer, around their checks and launches.

    - On Q's GPU: Triton launches a kernel on torch's current device, whatever device its
      tensors are on, so an op called with tensors on another GPU (a model on ``cuda:1``) runs
      with that GPU made current for the call.
    - No backward: the kernels have none. Where grad mode is on and an input requires grad, the
      scores still come back, as a tensor whose backward raises a RuntimeError naming the op,
      so a loss built on them fails loudly instead of training without their gradient."""
    @functools.wraps(op)
    def call(*args, **kwargs):
        Q = args[0] if args else kwargs.get("Q")
        if (isinstance(Q, torch.Tensor) and Q.is_cuda
                and Q.device.index != torch.cuda.current_device()):
            with torch.cuda.device(Q.device):
                scores = op(*args, **kwargs)
        else:
            scores = op(*args, **kwargs)
        if torch.is_grad_enabled():
            wanting = [t for t in (*args, *kwargs.values())
                       if isinstance(t, torch.Tensor) and t.requires_grad]
            if wanting:
                return _NoBackward.apply(op.__name__, scores, *wanting)
        return scores
    return call
