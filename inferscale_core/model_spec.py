"""What memory injection needs to know about a model architecture, in one place.

For each architecture: where the pre-RoPE keys and the values come out of an attention layer
(the capture side), which RoPE each layer applies (the re-rotation), how many KV-cache groups
vLLM gives it (the connector loads into one), and why a model is refused when it cannot be
served exactly. Pure data from the Hugging Face config; no model weights, no vLLM.

Supported: decoder-only models whose RoPE can be re-applied exactly — Llama (SmolLM2,
Llama 3.x), Mistral, Qwen2/2.5, Qwen3 (keys after its k-norm), and Gemma 3 (keys after its
k-norm; sliding-window layers with RoPE base 1e4 interleaved with global layers of base 1e6).

Sliding-window layers need no special filling: with a KV connector that does not declare
vLLM's hybrid-allocator support, vLLM turns every sliding-window layer's cache into a
full-attention one (``unify_hybrid_kv_cache_specs``) while the attention kernel still applies
the window, so all layers share one KV-cache group and injection fills every layer at every
position, as a prefill would; the window then hides the same far tokens from the same layers.
The engine-side check (:func:`cache_groups_refusal`) refuses an engine where this did not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from inferscale_core.rope import RopeSpec, UnsupportedRopeError, layer_type_params

#: model_type -> where the attention's pre-RoPE key comes from ("k_norm" runs after "k_proj").
KEY_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "llama": "k_proj",
        "mistral": "k_proj",
        "qwen2": "k_proj",
        "qwen3": "k_norm",
        "gemma3_text": "k_norm",
    }
)
#: Why some well-known architectures are refused, beyond "not in the list".
REFUSAL_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "gemma2": "its attention logits are soft-capped, which vLLM's paged kernels and this"
        " connector have not been checked against",
        "phi3": "its long-context RoPE (longrope) changes frequencies with the sequence length",
        "mamba": "it has no attention KV cache (a state-space model)",
        "jamba": "its Mamba layers keep a state, not a KV cache",
        "gpt2": "it uses learned absolute positions, not RoPE, so a memory cannot be moved",
        "bloom": "it uses ALiBi position biases, not RoPE, so a memory cannot be moved",
    }
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
        model_type = "gemma3_text" if model_type == "gemma3" else model_type
        if model_type not in KEY_SOURCES:
            why = REFUSAL_REASONS.get(model_type)
            raise UnsupportedModelError(
                f"model type {model_type!r} is not supported for memory injection"
                + (f": {why}" if why else "")
                + f" (supported: {', '.join(sorted(KEY_SOURCES))})"
            )
        neox = model_type not in GPTJ_STYLE_MODEL_TYPES
        layers = int(config.num_hidden_layers)
        try:
            layer_rope = tuple(
                _layer_rope(config, kind, neox) for kind in _layer_types(config, layers)
            )
        except UnsupportedRopeError as exc:
            raise UnsupportedModelError(f"{model_type}: {exc}") from exc
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(
            model_type=model_type,
            num_layers=layers,
            num_kv_heads=int(heads),
            head_dim=layer_rope[0].head_dim,
            layer_rope=layer_rope,
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


def _layer_types(config: Any, layers: int) -> list[str]:
    """Each layer's attention type ("full_attention", "sliding_attention", ...)."""
    kinds = list(getattr(config, "layer_types", None) or ())
    if not kinds:
        return ["full_attention"] * layers
    if len(kinds) != layers:
        raise UnsupportedRopeError(f"{len(kinds)} layer types for {layers} layers")
    return kinds


def _layer_rope(config: Any, layer_type: str, neox: bool) -> RopeSpec:
    """The RoPE of the layers of ``layer_type``, as vLLM's model applies it.

    transformers 5.x gives Gemma 3 its RoPE per layer type; 4.x gives the global layers
    ``rope_theta`` + ``rope_scaling`` and the sliding ones ``rope_local_base_freq`` unscaled
    (vLLM's ``gemma3.py`` reads the same fields).
    """
    if layer_type_params(config) is not None:
        return RopeSpec.from_hf_config(config, is_neox_style=neox, layer_type=layer_type)
    local_base = getattr(config, "rope_local_base_freq", None)
    if layer_type == "sliding_attention" and local_base is not None:
        local = _Local(config, {"rope_type": "default", "rope_theta": float(local_base)})
        return RopeSpec.from_hf_config(local, is_neox_style=neox)
    return RopeSpec.from_hf_config(config, is_neox_style=neox)


class _Local:
    """A config seen with other RoPE parameters (a 4.x Gemma 3's sliding layers)."""

    def __init__(self, config: Any, rope_parameters: dict) -> None:
        self._config, self.rope_parameters, self.rope_scaling = config, rope_parameters, None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)
