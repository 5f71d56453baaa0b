"""Chunked RoPE must reproduce the model's own post-RoPE keys (transformers as the reference)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from inferscale_core.rope import RopeSpec, UnsupportedRopeError, cos_sin, rotate
from tests.support.rope_inverse import unrotate

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

HEAD_DIM = 64
KV_HEADS = 2
# Small, mid and large positions; 131071 is the last one Llama-3.1's 128k context uses.
POSITIONS = torch.cat(
    [torch.arange(0, 11), torch.arange(5000, 5011), torch.tensor([100000, 131071])]
)

ROPE_PARAMETERS = {
    "default": {"rope_type": "default", "rope_theta": 1e5},
    "linear": {"rope_type": "linear", "rope_theta": 1e5, "factor": 4.0},
    "llama3": {  # Llama-3.1's
        "rope_type": "llama3",
        "rope_theta": 5e5,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 1e5,
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
    },
}
TYPES = list(ROPE_PARAMETERS)


def llama_config(rope_type: str, **overrides):
    kwargs = dict(
        vocab_size=97,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        # yarn: factor 4 over 4096 (transformers warns when the two disagree)
        max_position_embeddings=16384 if rope_type == "yarn" else 131072,
        rope_parameters=dict(ROPE_PARAMETERS[rope_type]),
    )
    kwargs.update(overrides)
    return transformers.LlamaConfig(**kwargs)


def hf_rotate(config, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Keys rotated by the model's own rotary embedding. k: [tokens, kv_heads, head_dim]."""
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    cos, sin = rotary(k, positions[None])  # [1, tokens, head_dim] each
    kb = k[None]  # [1, tokens, kv_heads, head_dim]
    _, k_embed = modeling_llama.apply_rotary_pos_emb(kb, kb, cos, sin, unsqueeze_dim=2)
    return k_embed[0]  # [tokens, kv_heads, head_dim]


# --- RopeSpec.from_hf_config against transformers' own parameter functions -------------------


@pytest.mark.parametrize("rope_type", TYPES)
def test_inv_freq_and_scaling_match_transformers(rope_type):
    config = llama_config(rope_type)
    spec = RopeSpec.from_hf_config(config)
    if rope_type == "default":
        fn = modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters
    else:
        fn = ROPE_INIT_FUNCTIONS[rope_type]
    inv_freq, scaling = fn(config)
    assert spec.rope_type == rope_type
    assert (spec.head_dim, spec.rotary_dim) == (HEAD_DIM, HEAD_DIM)
    assert torch.equal(torch.tensor(spec.inv_freq, dtype=torch.float32), inv_freq)
    assert spec.attention_scaling == scaling
    if rope_type == "yarn":
        assert spec.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1.0)


def test_yarn_options_match_transformers():
    """mscale/mscale_all_dim, beta_fast/slow and truncate=False follow transformers too."""
    params = dict(ROPE_PARAMETERS["yarn"], mscale=1.0, mscale_all_dim=0.5, beta_fast=16.0)
    for extra in ({}, {"truncate": False}, {"attention_factor": 1.25}):
        config = llama_config("yarn", rope_parameters=dict(params, **extra))
        spec = RopeSpec.from_hf_config(config)
        inv_freq, scaling = ROPE_INIT_FUNCTIONS["yarn"](config)
        assert torch.equal(torch.tensor(spec.inv_freq, dtype=torch.float32), inv_freq), extra
        assert spec.attention_scaling == scaling != 1.0


def test_old_style_config_matches_new_style():
    """transformers 4.x: rope_theta + rope_scaling with "type" or "rope_type"."""
    for key in ("type", "rope_type"):
        old = SimpleNamespace(
            hidden_size=128,
            num_attention_heads=2,
            head_dim=None,
            max_position_embeddings=131072,
            rope_theta=5e5,
            rope_scaling={
                key: "llama3",
                **{
                    k: v
                    for k, v in ROPE_PARAMETERS["llama3"].items()
                    if k not in ("rope_type", "rope_theta")
                },
            },
        )
        assert RopeSpec.from_hf_config(old) == RopeSpec.from_hf_config(llama_config("llama3"))
    plain = SimpleNamespace(hidden_size=128, num_attention_heads=2, rope_scaling=None)
    spec = RopeSpec.from_hf_config(plain)  # no RoPE fields at all: default, theta 10000
    assert spec.rope_type == "default" and spec.inv_freq[1] == pytest.approx(10000 ** (-2 / 64))


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32},
        {"type": "su", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32},
        {"rope_type": "mrope", "mrope_section": [16, 8, 8]},
    ],
)
def test_unsupported_rope_types_raise(params):
    name = params.get("rope_type") or params["type"]
    config = SimpleNamespace(
        hidden_size=128,
        num_attention_heads=2,
        rope_theta=1e4,
        rope_scaling=params,
        max_position_embeddings=4096,
    )
    with pytest.raises(UnsupportedRopeError, match=f"'{name}'.*default, linear, llama3, yarn"):
        RopeSpec.from_hf_config(config)
    assert issubclass(UnsupportedRopeError, ValueError)


def test_unsupported_from_transformers_config():
    config = llama_config("default", rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(UnsupportedRopeError, match="dynamic.*sequence length"):
        RopeSpec.from_hf_config(config)


# --- rotate against the model's rotary embedding ----------------------------------------------


@pytest.mark.parametrize("rope_type", TYPES)
def test_rotate_matches_llama_rotary_embedding(rope_type):
    config = llama_config(rope_type)
    spec = RopeSpec.from_hf_config(config)
    k = torch.randn(len(POSITIONS), KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    ours = rotate(k, POSITIONS, spec)
    ref = hf_rotate(config, k, POSITIONS)
    # Same fp32 inv_freq and the same ops in the same order: agreement is (near) bit-exact,
    # including at 1e5 where one fp32 ulp of inv_freq would already cost ~5e-3.
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    cos, sin = cos_sin(spec, POSITIONS)  # [tokens, rotary_dim // 2]
    hf_cos, hf_sin = modeling_llama.LlamaRotaryEmbedding(config)(k, POSITIONS[None])
    torch.testing.assert_close(cos, hf_cos[0, :, : HEAD_DIM // 2], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, hf_sin[0, :, : HEAD_DIM // 2], atol=1e-6, rtol=0)


def test_rotate_leading_dims_are_independent():
    spec = RopeSpec.from_hf_config(llama_config("llama3"))
    k = torch.randn(3, len(POSITIONS), KV_HEADS, HEAD_DIM)  # [layers, tokens, kv_heads, head_dim]
    out = rotate(k, POSITIONS, spec)
    for layer in range(3):
        assert torch.equal(out[layer], rotate(k[layer], POSITIONS, spec))
    with pytest.raises(ValueError, match="tokens=5"):
        rotate(k, POSITIONS[:5], spec)


# --- the acceptance test: pre-RoPE keys captured from a real forward -------------------------


def capture_pre_and_post(model, input_ids, position_ids):
    """Pre-RoPE keys from k_proj hooks and post-RoPE keys from the returned cache.

    Returns two [layers, tokens, kv_heads, head_dim] tensors.
    """
    pre, hooks = [], []
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for layer in model.model.layers:
        hooks.append(
            layer.self_attn.k_proj.register_forward_hook(
                lambda _m, _i, out: pre.append(out[0].view(out.shape[1], -1, head_dim))
            )
        )
    try:
        with torch.no_grad():
            result = model(input_ids=input_ids, position_ids=position_ids, use_cache=True)
    finally:
        for hook in hooks:
            hook.remove()
    cache = result.past_key_values
    # transformers 5: DynamicCache.layers[i].keys, [batch, kv_heads, seq, head_dim]
    post = [layer.keys[0].transpose(0, 1) for layer in cache.layers]
    return torch.stack(pre), torch.stack(post)


@pytest.mark.parametrize("start", [0, 3000])
@pytest.mark.parametrize("rope_type", TYPES)
def test_rotate_reproduces_llama_cache(rope_type, start):
    torch.manual_seed(0)
    config = llama_config(rope_type, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    tokens = 12
    input_ids = torch.randint(0, config.vocab_size, (1, tokens))
    positions = torch.arange(start, start + tokens)
    k_pre, k_post = capture_pre_and_post(model, input_ids, positions[None])
    assert k_pre.shape == (2, tokens, KV_HEADS, HEAD_DIM) == k_post.shape
    assert not torch.allclose(k_pre, k_post)
    spec = RopeSpec.from_hf_config(config)
    torch.testing.assert_close(rotate(k_pre, positions, spec), k_post, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(unrotate(k_post, positions, spec), k_pre, atol=1e-5, rtol=1e-5)


def test_rotate_reproduces_phi_partial_rotary_cache():
    """Phi rotates only the first partial_rotary_factor * head_dim dims (neox style)."""
    torch.manual_seed(0)
    config = transformers.PhiConfig(
        vocab_size=97,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        partial_rotary_factor=0.5,
        attn_implementation="eager",
    )
    model = transformers.PhiForCausalLM(config).eval()
    positions = torch.arange(700, 710)
    k_pre, k_post = capture_pre_and_post(model, torch.randint(0, 97, (1, 10)), positions[None])
    spec = RopeSpec.from_hf_config(config)
    assert (spec.head_dim, spec.rotary_dim) == (64, 32)
    torch.testing.assert_close(rotate(k_pre, positions, spec), k_post, atol=1e-5, rtol=1e-5)


# --- gptj (interleaved) style ------------------------------------------------------------------


def interleaved_reference(k: torch.Tensor, positions: torch.Tensor, spec: RopeSpec):
    """Pairs (2i, 2i+1) as complex numbers times exp(i * pos * inv_freq_i), in fp64."""
    rd = spec.rotary_dim
    angles = positions.double()[:, None] * torch.tensor(spec.inv_freq, dtype=torch.float64)
    turn = torch.polar(torch.ones_like(angles), angles)[:, None, :]  # [tokens, 1, rd // 2]
    pairs = torch.view_as_complex(k[..., :rd].double().reshape(*k.shape[:-1], rd // 2, 2))
    rotated = torch.view_as_real(pairs * turn).flatten(-2)
    return torch.cat((rotated, k[..., rd:].double()), dim=-1).float()


def test_gptj_matches_interleaved_reference_and_transformers_gptj():
    from transformers.models.gptj import modeling_gptj

    config = SimpleNamespace(
        hidden_size=256, num_attention_heads=4, rope_theta=10000.0, partial_rotary_factor=0.5
    )
    spec = RopeSpec.from_hf_config(config, is_neox_style=False)
    assert (spec.head_dim, spec.rotary_dim, spec.is_neox_style) == (64, 32, False)
    positions = torch.arange(0, 40)
    k = torch.randn(2, len(positions), KV_HEADS, HEAD_DIM)  # [layers, tokens, kv_heads, head_dim]
    ours = rotate(k, positions, spec)
    # fp64 ground truth: angles up to 39 rad in fp32 are only good to ~4e-6.
    torch.testing.assert_close(ours, interleaved_reference(k, positions, spec), atol=2e-5, rtol=0)
    # GPT-J's own code: sin/cos table, then x * cos + rotate_every_two(x) * sin on rotary dims.
    table = modeling_gptj.create_sinusoidal_positions(int(positions.max()) + 1, spec.rotary_dim)
    sin, cos = torch.split(table[positions][None], spec.rotary_dim // 2, dim=-1)
    for layer in range(2):
        k_rot = modeling_gptj.apply_rotary_pos_emb(k[layer][None, ..., :32], sin, cos)[0]
        torch.testing.assert_close(ours[layer, ..., :32], k_rot, atol=1e-5, rtol=1e-5)
    assert torch.equal(ours[..., 32:], k[..., 32:])
    neox = rotate(k, positions, dataclasses.replace(spec, is_neox_style=True))
    assert not torch.allclose(neox[:, 1:], ours[:, 1:], atol=1e-3)
    torch.testing.assert_close(neox[:, 0], ours[:, 0])  # position 0 is the identity for both


# --- inverse, partial rotary, dtypes -------------------------------------------------------------


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("rope_type", TYPES)
def test_unrotate_inverts_rotate(rope_type, partial, neox):
    params = dict(ROPE_PARAMETERS[rope_type], partial_rotary_factor=partial)
    spec = RopeSpec.from_hf_config(llama_config(rope_type, rope_parameters=params), neox)
    assert spec.rotary_dim == int(HEAD_DIM * partial) == 2 * len(spec.inv_freq)
    k = torch.randn(2, len(POSITIONS), KV_HEADS, HEAD_DIM)  # [layers, tokens, kv_heads, head_dim]
    rotated = rotate(k, POSITIONS, spec)
    torch.testing.assert_close(unrotate(rotated, POSITIONS, spec), k, atol=1e-5, rtol=1e-5)
    rd = spec.rotary_dim
    assert torch.equal(rotated[..., rd:], k[..., rd:])  # pass-through dims untouched
    norm_ratio = rotated[..., :rd].norm(dim=-1) / k[..., :rd].norm(dim=-1)
    torch.testing.assert_close(norm_ratio, torch.full_like(norm_ratio, spec.attention_scaling))


@pytest.mark.parametrize("rope_type", ["default", "yarn"])
def test_out_dtype_rounds_once(rope_type):
    spec = RopeSpec.from_hf_config(llama_config(rope_type))
    k = torch.randn(2, len(POSITIONS), KV_HEADS, HEAD_DIM)  # fp32
    fp32 = rotate(k, POSITIONS, spec)
    bf16 = rotate(k, POSITIONS, spec, out_dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, fp32.to(torch.bfloat16))
    k16 = k.to(torch.bfloat16)  # default out dtype is the input's; math still in fp32
    once = rotate(k16.float(), POSITIONS, spec).bfloat16()
    assert torch.equal(rotate(k16, POSITIONS, spec), once)
    assert rotate(k16, POSITIONS, spec, out_dtype=torch.float32).dtype == torch.float32
    back = unrotate(fp32, POSITIONS, spec, out_dtype=torch.bfloat16)
    assert torch.equal(back, unrotate(fp32, POSITIONS, spec).bfloat16())
