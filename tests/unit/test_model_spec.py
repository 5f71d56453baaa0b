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
from tests.support.hf_modules import attention_modules, capture_modules
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
    attentions = attention_modules(model)
    assert len(attentions) == 3
    k_module, v_module = capture_modules(spec, attentions[1])
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


def _gemma3(**overrides):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **{
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "sliding_window": 16,
            **overrides,
        }
    )


def test_gemma3_rope_per_layer_type_matches_the_models_own():
    """Sliding layers rotate with base 1e4, global ones with 1e6: each layer's spec carries the
    inverse frequencies of the rotary embedding the Hugging Face model applies to it."""
    from transformers import Gemma3ForCausalLM

    config = _gemma3()
    spec = ModelSpec.from_hf_config(config)
    kinds = config.layer_types
    assert kinds.count("full_attention") == 1 and kinds[-1] == "full_attention"
    assert spec.model_type == "gemma3_text" and spec.key_source == "k_norm"
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (6, 1, 32)
    assert spec.shared_rope is None  # two RoPEs: the worker rotates each run of layers alone
    assert spec.rope(0) == spec.rope(4) != spec.rope(5)
    rotary = Gemma3ForCausalLM(config).model.rotary_emb
    for layer, kind in enumerate(kinds):
        ours = torch.tensor(spec.rope(layer).inv_freq)
        theirs = getattr(rotary, f"{kind}_inv_freq").float()
        assert torch.equal(ours, theirs), (layer, kind)


def test_gemma3_keys_come_after_its_k_norm():
    from transformers import Gemma3ForCausalLM

    model = Gemma3ForCausalLM(_gemma3())
    spec = ModelSpec.from_hf_config(model.config)
    k_module, v_module = capture_modules(spec, attention_modules(model)[0])
    assert k_module is model.model.layers[0].self_attn.k_norm
    assert v_module is model.model.layers[0].self_attn.v_proj


def test_gemma3_in_the_older_config_style_gets_its_local_base():
    """transformers 4.x: ``rope_theta`` for global layers, ``rope_local_base_freq`` for the
    sliding ones (vLLM's gemma3.py reads the same fields)."""
    kinds = ["sliding_attention"] * 2 + ["full_attention"]
    old = SimpleNamespace(
        model_type="gemma3_text",
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        hidden_size=64,
        max_position_embeddings=1024,
        layer_types=kinds,
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    )
    spec = ModelSpec.from_hf_config(old)
    new = ModelSpec.from_hf_config(
        _gemma3(
            num_hidden_layers=3,
            layer_types=kinds,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
            },
        )
    )
    assert spec.layer_rope == new.layer_rope
    assert spec.rope(2).rope_type == "linear" and spec.rope(0).rope_type == "default"


def test_refusals_name_the_reason_and_the_supported_list():
    with pytest.raises(UnsupportedModelError, match="ALiBi") as info:
        ModelSpec.from_hf_config(SimpleNamespace(model_type="bloom"))
    assert "gemma3_text" in str(info.value) and "llama" in str(info.value)
    assert set(KEY_SOURCES) >= {"llama", "mistral", "qwen2", "qwen3", "gemma3_text"}


def test_one_kv_cache_group_is_served_and_several_are_refused():
    assert cache_groups_refusal(1) is None
    assert "2 groups" in cache_groups_refusal(2)
