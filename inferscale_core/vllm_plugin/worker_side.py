"""Worker side of the connector: re-rotate stored pre-RoPE keys and write them into the cache.

The write goes through the attention backend's own cache-update function
(``layer.impl.do_kv_cache_update``), the same call the forward pass makes, so every cache
layout (the CPU backend's ISA-packed keys, FLASH_ATTN's blocks) is written as the backend
expects it. The load is synchronous, before the forward, and never touches
``forward_context.attn_metadata`` (None under full CUDA graphs).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from inferscale_core.kvstore import KVStore
from inferscale_core.rope import RopeSpec, rotate
from inferscale_core.vllm_plugin.metadata import InjectionMetadata, LoadOp

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

# Model types whose RoPE rotates interleaved pairs (GPT-J style) instead of halves (NeoX style).
_GPTJ_STYLE_MODEL_TYPES = frozenset({"gptj", "chatglm", "glm"})


def attention_layers(vllm_config: VllmConfig) -> list[tuple[str, Any]]:
    """The model's attention layers that own a KV cache, in layer order."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.models.utils import extract_layer_index

    context = vllm_config.compilation_config.static_forward_context
    layers = [
        (name, layer)
        for name, layer in context.items()
        if isinstance(layer, Attention)
        and getattr(layer, "kv_sharing_target_layer_name", None) is None
    ]
    return sorted(layers, key=lambda item: extract_layer_index(item[0]))


class InjectionWorker:
    """Executes the step's :class:`LoadOp` list before the forward."""

    def __init__(self, vllm_config: VllmConfig, store: KVStore) -> None:
        self.vllm_config = vllm_config
        self.store = store
        hf_config = vllm_config.model_config.hf_text_config
        self.rope = RopeSpec.from_hf_config(
            hf_config, is_neox_style=hf_config.model_type not in _GPTJ_STYLE_MODEL_TYPES
        )
        self._layers: list[tuple[str, Any]] | None = None
        self.last_load_ms: float = 0.0

    @property
    def layers(self) -> list[tuple[str, Any]]:
        if self._layers is None:
            self._layers = attention_layers(self.vllm_config)
        return self._layers

    def start_load_kv(self, meta: InjectionMetadata) -> None:
        for op in meta.loads:
            t0 = time.perf_counter()
            self._load(op)
            self.last_load_ms = (time.perf_counter() - t0) * 1e3
            log.debug(
                "request %s: injected %d tokens in %.2f ms",
                op.req_id,
                op.end - op.start,
                self.last_load_ms,
            )

    def _gather(self, op: LoadOp) -> tuple[torch.Tensor, torch.Tensor]:
        ks, vs = [], []
        for piece in op.pieces:
            entry = self.store.get(piece.key)
            ks.append(
                entry.k[:, piece.src_start : piece.src_end]
            )  # [layers, n, kv_heads, head_dim]
            vs.append(entry.v[:, piece.src_start : piece.src_end])
        return torch.cat(ks, dim=1), torch.cat(
            vs, dim=1
        )  # [layers, end - start, kv_heads, head_dim]

    def _load(self, op: LoadOp) -> None:
        layers = self.layers
        k_pre, v = self._gather(op)  # [layers, tokens, kv_heads, head_dim] fp32, pre-RoPE
        if k_pre.shape[0] != len(layers) or k_pre.shape[1] != len(op.slots):
            raise RuntimeError(
                f"stored KV {tuple(k_pre.shape)} does not fit {len(layers)} layers and"
                f" {len(op.slots)} slots; the scheduler should have refused this request"
            )
        first_cache = _layer_cache(layers[0][1])
        device, dtype = first_cache.device, first_cache.dtype
        positions = torch.arange(op.start, op.end, dtype=torch.int64)  # [tokens]
        k_post = rotate(k_pre.to(device), positions.to(device), self.rope, out_dtype=dtype)
        v = v.to(device=device, dtype=dtype)
        slots = torch.tensor(op.slots, dtype=torch.int64, device=device)  # [tokens]
        for index, (_, layer) in enumerate(layers):
            layer.impl.do_kv_cache_update(
                layer, k_post[index], v[index], _layer_cache(layer), slots
            )


def _layer_cache(layer: Any) -> torch.Tensor:
    """The layer's paged KV cache (a tensor in vLLM 0.32; older versions keep a list per engine)."""
    cache = layer.kv_cache
    return cache[0] if isinstance(cache, (list, tuple)) else cache
