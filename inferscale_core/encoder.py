"""Reference encoder: pre-RoPE K and V of an entry, captured with Hugging Face forward hooks.

The entry's tokens are run after their context (the system prefix and, for a fact, its w
preceding turns) in one forward pass; hooks on each layer's ``k_proj`` / ``v_proj`` (or the
k-norm after ``k_proj`` where a model has one) record the projections *before* rotary embedding,
and only the entry's own tokens are kept. Hugging Face's ``past_key_values`` are post-RoPE and
are never used as pre-RoPE. This path is simple and exact; it is the oracle for faster ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from inferscale_core.types import FactKV

ENCODER_VERSION = "hf-hooks/1"


class HFReferenceEncoder:
    """Encodes entries with a Hugging Face copy of the model (fp32 by default)."""

    def __init__(
        self,
        model_dir: Path | str,
        fingerprint: str,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.fingerprint = fingerprint
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype, attn_implementation="eager"
        ).to(device)
        self.model.eval()
        config = self.model.config
        self.num_kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )

    def _attention_modules(self) -> list[torch.nn.Module]:
        return [layer.self_attn for layer in self.model.model.layers]

    @torch.inference_mode()
    def encode(self, key: str, context_ids: Sequence[int], entry_ids: Sequence[int]) -> FactKV:
        """K/V of ``entry_ids`` as they are computed right after ``context_ids``."""
        if not entry_ids:
            raise ValueError("an entry needs at least one token")
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        handles = []
        for attn in self._attention_modules():
            # Models with a k-norm (e.g. Qwen3) normalise after k_proj and before RoPE.
            k_module = attn.k_norm if hasattr(attn, "k_norm") else attn.k_proj
            handles.append(k_module.register_forward_hook(_capture(keys)))
            handles.append(attn.v_proj.register_forward_hook(_capture(values)))
        try:
            ids = torch.tensor([list(context_ids) + list(entry_ids)], device=self.device)
            self.model.model(input_ids=ids, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        n = len(entry_ids)
        shape = (len(keys), -1, self.num_kv_heads, self.head_dim)
        k = torch.stack([t[0, -n:].reshape(n, -1) for t in keys]).reshape(shape)
        v = torch.stack([t[0, -n:].reshape(n, -1) for t in values]).reshape(shape)
        # k, v: [layers, tokens, kv_heads, head_dim]
        return FactKV(key, list(entry_ids), k.float().cpu(), v.float().cpu(), self.fingerprint)


def _capture(sink: list[torch.Tensor]):
    def hook(_module: torch.nn.Module, _inputs: object, output: torch.Tensor) -> None:
        sink.append(
            output.detach()
        )  # [1, tokens, kv_heads * head_dim] or [1, tokens, kv_heads, head_dim]

    return hook
