"""Scheduler -> worker metadata of one engine step. Pickled by vLLM: ids and slots, no tensors."""

from __future__ import annotations

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
    slots: list[int]  # [end - start] cache slot of each position


@dataclass
class InjectionMetadata(KVConnectorMetadata):
    loads: list[LoadOp] = field(default_factory=list)
