"""Where a Hugging Face model's pre-RoPE K and V come out, for the tests' oracle (hf_encoder)."""

from __future__ import annotations

from typing import Any

from inferscale_core.model_spec import ModelSpec


def attention_modules(model: Any) -> list[Any]:
    """The attention module of each layer of a Hugging Face ``*ForCausalLM``."""
    return [layer.self_attn for layer in model.model.layers]


def capture_modules(spec: ModelSpec, attention: Any) -> tuple[Any, Any]:
    """``(key module, value module)`` of one attention layer: their outputs are the layer's
    pre-RoPE K and V, ``[batch, tokens, kv_heads * head_dim]`` (after a k-norm, where the
    spec's ``key_source`` names one)."""
    return getattr(attention, spec.key_source), getattr(attention, spec.value_source)
