"""Scheduler -> worker metadata of one engine step, pickled by vLLM: ids and slots, no tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from inferscale_core.load_plan import Piece


@dataclass(slots=True)
class LoadOp:
    """Write stored KV for prompt positions ``[start, end)`` of one request into ``slots``."""

    req_id: str
    start: int
    end: int
    pieces: list[Piece]
    slots: Sequence[int]  # int64 [end - start] cache slot of each position (numpy array)


@dataclass
class InjectionMetadata(KVConnectorMetadata):
    loads: list[LoadOp] = field(default_factory=list)
