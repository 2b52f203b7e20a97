"""Data-parallel MaxSim over a corpus sharded by pid ranges with torch.distributed.

Each rank holds a contiguous pid range of the corpus (dense embeddings, colbert-ai residual codes
or PQ codes), scores it with the package's kernels, and one all-gather of int64 (score, pid) keys
merges the local top-k into the global one, equal to the single-process result ties included.
See PLAN.md beside this file for the sizes and costs at 8 GPUs and several hosts.
"""

from tilemaxsim_plaid.distributed.launch import init_from_env
from tilemaxsim_plaid.distributed.plaid_index import (
    load_plaid_shard,
    plaid_pid_ranges,
    read_plaid_layout,
)
from tilemaxsim_plaid.distributed.plaid_search import (
    shard_index_scorer,
    shard_searcher,
    unshard_index_scorer,
)
from tilemaxsim_plaid.distributed.scorers import default_scorer
from tilemaxsim_plaid.distributed.sharded_index import (
    ShardedDenseIndex,
    ShardedIndex,
    ShardedResidualIndex,
)
from tilemaxsim_plaid.distributed.shards import DenseShard, PQShard, ResidualShard, partition_pid_ranges
from tilemaxsim_plaid.distributed.topk import exact_topk

__all__ = [
    "DenseShard",
    "PQShard",
    "ResidualShard",
    "ShardedDenseIndex",
    "ShardedIndex",
    "ShardedResidualIndex",
    "default_scorer",
    "exact_topk",
    "init_from_env",
    "load_plaid_shard",
    "partition_pid_ranges",
    "plaid_pid_ranges",
    "read_plaid_layout",
    "shard_index_scorer",
    "shard_searcher",
    "unshard_index_scorer",
]
