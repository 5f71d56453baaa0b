"""What memory injection needs to know about a model architecture, in one place.

For each architecture: where the pre-RoPE keys and the values come out of an attention layer
(the capture side), which RoPE each layer applies (the re-rotation), how many KV-cache groups
vLLM gives it (the connector loads into one), and why a model is refused when it cannot be
served exactly. Pure data from the Hugging Face config; no model weights, no vLLM.

Supported today: decoder-only models with full attention in every layer and one RoPE for all
layers — Llama (SmolLM2, Llama 3.x), Mistral, Qwen2/2.5, Qwen3 (keys after its k-norm).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from inferscale_core.rope import RopeSpec, UnsupportedRopeError

#: model_type -> where the attention's pre-RoPE key comes from ("k_norm" runs after "k_proj").
KEY_SOURCES: Mapping[str, str] = MappingProxyType(
    {"llama": "k_proj", "mistral": "k_proj", "qwen2": "k_proj", "qwen3": "k_norm"}
)
#: Model types whose RoPE rotates interleaved pairs (GPT-J style) instead of halves (NeoX).
GPTJ_STYLE_MODEL_TYPES = frozenset({"gptj", "chatglm", "glm"})


class UnsupportedModelError(ValueError):
    """The model cannot be served with exact memory injection; the message says why."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One architecture's answers, from its config (see :meth:`from_hf_config`)."""

    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_rope: tuple[RopeSpec, ...]  # the RoPE of each layer, in layer order
    key_source: str  # attention submodule whose output is the pre-RoPE key
    value_source: str = "v_proj"

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelSpec:
        """The spec of a transformers config (its text config for multimodal wrappers).

        Raises :class:`UnsupportedModelError` for an architecture not listed in
        :data:`KEY_SOURCES`, sliding-window layers, or a RoPE that cannot be re-applied exactly.
        """
        config = getattr(config, "text_config", None) or config
        model_type = getattr(config, "model_type", "")
        if model_type not in KEY_SOURCES:
            raise UnsupportedModelError(
                f"model type {model_type!r} is not supported for memory injection (supported:"
                f" {', '.join(sorted(KEY_SOURCES))})"
            )
        if _sliding_window_layers(config):
            raise UnsupportedModelError(
                f"{model_type} uses sliding-window attention layers; injected memories would"
                " need a KV-cache group per window, which is not supported yet"
            )
        try:
            rope = RopeSpec.from_hf_config(
                config, is_neox_style=model_type not in GPTJ_STYLE_MODEL_TYPES
            )
        except UnsupportedRopeError as exc:
            raise UnsupportedModelError(f"{model_type}: {exc}") from exc
        layers = int(config.num_hidden_layers)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(
            model_type=model_type,
            num_layers=layers,
            num_kv_heads=int(heads),
            head_dim=rope.head_dim,
            layer_rope=(rope,) * layers,
            key_source=KEY_SOURCES[model_type],
        )

    def rope(self, layer: int) -> RopeSpec:
        """The RoPE layer ``layer`` applies to its keys."""
        return self.layer_rope[layer]

    @property
    def shared_rope(self) -> RopeSpec | None:
        """The one RoPE of every layer, or None when layers differ (one kernel for all layers
        needs it)."""
        first = self.layer_rope[0]
        return first if all(r == first for r in self.layer_rope) else None

    def attention_modules(self, model: Any) -> list[Any]:
        """The attention module of each layer of a Hugging Face ``*ForCausalLM``."""
        return [layer.self_attn for layer in model.model.layers]

    def capture_modules(self, attention: Any) -> tuple[Any, Any]:
        """``(key module, value module)`` of one attention layer: their outputs are the
        layer's pre-RoPE K and V, ``[batch, tokens, kv_heads * head_dim]``."""
        return getattr(attention, self.key_source), getattr(attention, self.value_source)


def cache_groups_refusal(num_groups: int) -> str | None:
    """Why an engine whose KV cache has ``num_groups`` groups cannot take injected KV, or None.

    The connector writes one block table (a request's first group); a model whose layers are
    split over several groups (sliding windows, hybrid attention) would get the others unfilled.
    """
    if num_groups == 1:
        return None
    return (
        f"the engine's KV cache has {num_groups} groups (e.g. sliding-window layers); injection"
        " fills one, so memories are prefilled instead"
    )


def _sliding_window_layers(config: Any) -> bool:
    layer_types = getattr(config, "layer_types", None) or ()
    if any(kind != "full_attention" for kind in layer_types):
        return True
    window = getattr(config, "sliding_window", None)
    use = getattr(config, "use_sliding_window", window is not None)
    return bool(window) and bool(use) and not layer_types
