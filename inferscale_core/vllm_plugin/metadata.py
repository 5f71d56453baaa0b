"""Scheduler -> worker metadata of one engine step, pickled by vLLM: ids and block ids, no
tensors."""

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


@dataclass
class InjectionMetadata(KVConnectorMetadata):
    loads: list[LoadOp] = field(default_factory=list)
