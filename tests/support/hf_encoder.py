"""The oracle encoder (tests only): an entry's K and V from a Hugging Face copy of the model.

The entry's tokens are run after their context (the system prefix and, for a fact, its w
preceding turns) in one forward pass; hooks where the model spec says the keys and values come
out of each attention layer (``k_proj`` / ``v_proj``, or the k-norm after ``k_proj`` where a
model has one) record the projections *before* rotary embedding, and only the entry's own
tokens are kept. The keys are then rotated with ``rope.rotate`` to the positions the entry had
(the product's stored form: post-RoPE at the entry's origin). Hugging Face's
``past_key_values`` are never used. Simple and exact: what the engine's capture is checked
against. The product encodes through the engine (``inferscale_core.encoding``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from inferscale_core.encoding import EncodeItem
from inferscale_core.kvstore import KVStore
from inferscale_core.model_spec import ModelSpec
from inferscale_core.rope import rotate
from inferscale_core.types import FactKV
from tests.support.hf_modules import attention_modules, capture_modules

ORACLE_VERSION = "hf-oracle/1"


class HFReferenceEncoder:
    """Encodes entries with a Hugging Face copy of the model (fp32 by default).

    Also an :class:`~inferscale_core.encoding.Encoder` (give it a ``store``): a prompt builder
    over it encodes with the oracle, under its own version. Thread-safe: the K/V are captured
    by forward hooks on the shared model, so one lock serialises the passes.
    """

    version = ORACLE_VERSION
    store: KVStore | None = None  # where ``encode`` puts the entries

    def __init__(
        self,
        model_dir: Path | str,
        fingerprint: str,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        *,
        kv_dtype: torch.dtype = torch.float32,
        kv_device: str = "cpu",
    ) -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=dtype, attn_implementation=attention_implementation(device)
        ).to(device)
        self._adopt(model, fingerprint, kv_dtype, kv_device)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        fingerprint: str,
        *,
        kv_dtype: torch.dtype = torch.float32,
        kv_device: str = "cpu",
    ) -> HFReferenceEncoder:
        """An encoder over an already-built model (e.g. random weights from a config: the GPU
        benches time encoding on shapes whose weights are not here)."""
        encoder = cls.__new__(cls)
        encoder._adopt(model, fingerprint, kv_dtype, kv_device)
        return encoder

    def _adopt(
        self, model: torch.nn.Module, fingerprint: str, kv_dtype: torch.dtype, kv_device: str
    ) -> None:
        self.fingerprint = fingerprint
        self.model = model
        self.model.eval()
        self.device = next(model.parameters()).device
        self.kv_dtype = kv_dtype  # what the entries hold: the serving KV cache's dtype
        self.kv_device = torch.device(kv_device)
        self._lock = threading.Lock()
        self.spec = ModelSpec.from_hf_config(self.model.config)
        self.num_kv_heads = self.spec.num_kv_heads
        self.head_dim = self.spec.head_dim

    def synchronize(self) -> None:
        """Wait until the device has run the queued work (CUDA is asynchronous; CPU is not)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def encode_one(self, key: str, context_ids: Sequence[int], entry_ids: Sequence[int]) -> FactKV:
        """K/V of ``entry_ids`` as they are computed right after ``context_ids``."""
        return self.encode_batch([(key, context_ids, entry_ids)])[0]

    def encode(self, items: Sequence[EncodeItem]) -> None:
        """The Encoder protocol: ``items`` encoded into ``self.store``."""
        assert self.store is not None, "give the oracle a store to encode into"
        batch = [(item.key, item.context_ids, item.entry_ids) for item in items]
        for entry in self.encode_batch(batch):
            self.store.put(entry)

    @torch.inference_mode()
    def encode_batch(
        self, items: Sequence[tuple[str, Sequence[int], Sequence[int]]]
    ) -> list[FactKV]:
        """Encode several ``(key, context_ids, entry_ids)`` in one forward pass.

        Sequences are right-padded: under causal attention a token never sees what follows it,
        so padding changes nothing for the real tokens and batching stays exact.
        """
        if not items:
            return []
        for key, _, entry_ids in items:
            if not entry_ids:
                raise ValueError(f"entry {key} needs at least one token")
        sequences = [list(ctx) + list(ids) for _, ctx, ids in items]
        width = max(len(seq) for seq in sequences)
        ids = torch.zeros(len(sequences), width, dtype=torch.long)  # [batch, width]
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq)
        with self._lock:
            keys, values = self._forward(ids)
        batch, layers = len(sequences), len(keys)
        k_all = torch.stack([t.reshape(batch, width, -1) for t in keys], dim=1)
        v_all = torch.stack([t.reshape(batch, width, -1) for t in values], dim=1)
        # k_all, v_all: [batch, layers, width, kv_heads * head_dim]
        out = []
        for row, (key, ctx, entry_ids) in enumerate(items):
            start, n = len(ctx), len(entry_ids)
            shape = (layers, n, self.num_kv_heads, -1)
            k_pre = k_all[row, :, start : start + n].reshape(shape).float()
            # [layers, tokens, kv_heads, head_dim], rotated where the entry sat (fp32, then one
            # rounding to the entry's dtype)
            positions = torch.arange(start, start + n, device=k_pre.device)
            k = self._owned(rotate(k_pre, positions, self.spec.rope(0)))
            v = self._owned(v_all[row, :, start : start + n].reshape(shape))
            out.append(FactKV(key, list(entry_ids), k, v, self.fingerprint, origin=start))
        return out

    def _owned(self, kv: torch.Tensor) -> torch.Tensor:
        """A contiguous copy in the entry's dtype and place (never a view that would keep the
        whole batch's K/V alive)."""
        return kv.to(device=self.kv_device, dtype=self.kv_dtype, copy=True).contiguous()

    def _forward(self, ids: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One forward pass; the per-layer K (pre-RoPE) and V it computed. Hold the lock."""
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        handles = []
        for attn in attention_modules(self.model):
            # Where the spec says the pre-RoPE key comes out (after a k-norm, where one is).
            k_module, v_module = capture_modules(self.spec, attn)
            handles.append(k_module.register_forward_hook(_capture(keys)))
            handles.append(v_module.register_forward_hook(_capture(values)))
        try:
            self.model.model(input_ids=ids.to(self.device), use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        return keys, values


def attention_implementation(device: torch.device | str) -> str:
    """Hugging Face attention for the encoder on ``device``.

    CUDA gets ``sdpa`` (fused kernels; with no attention mask it runs causal, so right padding
    still changes nothing for the real tokens). CPU keeps ``eager``: it is the reference the
    exactness tests compare vLLM's prefill against.
    """
    return "sdpa" if torch.device(device).type == "cuda" else "eager"


def _capture(sink: list[torch.Tensor]):
    def hook(_module: torch.nn.Module, _inputs: object, output: torch.Tensor) -> None:
        sink.append(
            output.detach()
        )  # [1, tokens, kv_heads * head_dim] or [1, tokens, kv_heads, head_dim]

    return hook
