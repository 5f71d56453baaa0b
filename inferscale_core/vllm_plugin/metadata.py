"""Scheduler -> worker metadata of one engine step, pickled by vLLM: ids and block ids, no
tensors. Loads run before the step's forward, saves (captures) right after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from inferscale_core.load_plan import Piece, slot_mapping


@dataclass(slots=True)
class LoadOp:
    """Write stored KV for prompt positions ``[start, end)`` of one request into its blocks."""

    req_id: str
    start: int
    end: int
    pieces: list[Piece]
    block_ids: Sequence[int]  # the request's block table from position 0, reaching ``end``

    def slots(self, block_size: int) -> np.ndarray:
        """int64 [end - start]: the cache slot of each position."""
        return slot_mapping(self.block_ids, block_size, self.start, self.end)


@dataclass(slots=True)
class SaveOp:
    """Copy the K/V of prompt positions ``[start, end)`` of one request out of its blocks, as
    the store entry ``key`` (keys post-RoPE at ``start``: its origin). Emitted in the step
    whose forward computes the span's last token; done right after that forward."""

    req_id: str
    key: str
    start: int
    end: int
    token_ids: list[int]  # the span's token ids, stored with the entry
    block_ids: Sequence[int]  # the request's block table from position 0, reaching ``end``

    def slots(self, block_size: int) -> np.ndarray:
        """int64 [end - start]: the cache slot of each position."""
        return slot_mapping(self.block_ids, block_size, self.start, self.end)


@dataclass
class InjectionMetadata(KVConnectorMetadata):
    loads: list[LoadOp] = field(default_factory=list)
    saves: list[SaveOp] = field(default_factory=list)
