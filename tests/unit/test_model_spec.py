"""The per-architecture spec: where K/V come from, RoPE per layer, refusals that explain."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config

from inferscale_core.model_spec import (
    KEY_SOURCES,
    ModelSpec,
    UnsupportedModelError,
    cache_groups_refusal,
)
from inferscale_core.rope import RopeSpec
from tests.unit.test_rope import llama_config


def _llama(**overrides) -> LlamaConfig:
    return llama_config("default", **{"num_hidden_layers": 3, **overrides})


def test_llama_spec_has_one_rope_per_layer_and_keys_from_k_proj():
    config = _llama()
    spec = ModelSpec.from_hf_config(config)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (3, 2, 64)
    assert len(spec.layer_rope) == 3 and spec.shared_rope == RopeSpec.from_hf_config(config)
    assert spec.rope(2) is spec.layer_rope[2] and spec.rope(0).is_neox_style
    assert spec.key_source == "k_proj" and spec.value_source == "v_proj"


def test_capture_modules_are_the_hf_models_own_projections():
    model = LlamaForCausalLM(_llama())
    spec = ModelSpec.from_hf_config(model.config)
    attentions = spec.attention_modules(model)
    assert len(attentions) == 3
    k_module, v_module = spec.capture_modules(attentions[1])
    assert k_module is model.model.layers[1].self_attn.k_proj
    assert v_module is model.model.layers[1].self_attn.v_proj
    out = k_module(torch.zeros(1, 5, 128))  # [batch, tokens, kv_heads * head_dim]
    assert out.shape == (1, 5, spec.num_kv_heads * spec.head_dim)


def test_qwen3_keys_come_after_its_k_norm():
    config = Qwen3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
    )
    assert ModelSpec.from_hf_config(config).key_source == "k_norm"


def test_shared_rope_is_none_when_layers_differ():
    spec = ModelSpec.from_hf_config(_llama())
    other = RopeSpec(64, 64, (1.0,) * 32, 1.0, True, "default")
    mixed = ModelSpec(
        spec.model_type, 3, 2, 64, (spec.rope(0), other, spec.rope(0)), spec.key_source
    )
    assert mixed.shared_rope is None


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (SimpleNamespace(model_type="gpt2"), "not supported"),
        (_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
    ],
)
def test_unsupported_models_are_refused_with_the_reason(config, why):
    with pytest.raises(UnsupportedModelError, match=why) as info:
        ModelSpec.from_hf_config(config)
    assert "supported" in str(info.value) or "RoPE" in str(info.value)


def test_sliding_window_layers_are_refused():
    config = _llama()
    config.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        ModelSpec.from_hf_config(config)
    assert set(KEY_SOURCES) >= {"llama", "mistral", "qwen2", "qwen3"}


def test_one_kv_cache_group_is_served_and_several_are_refused():
    assert cache_groups_refusal(1) is None
    assert "2 groups" in cache_groups_refusal(2)
