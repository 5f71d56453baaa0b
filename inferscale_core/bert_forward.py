"""A sentence-transformers BERT model (MiniLM) run in few calls: the forward of a question.

A question is ~12-16 tokens, so MiniLM's forward is mostly per-call overhead, not arithmetic:
through transformers' modules it makes ~37 matmuls and ~120 other calls per question, each
with its Python bookkeeping. :class:`BertForward` computes the same function with the weights
it reads once: Q, K and V as one matmul, PyTorch's fused attention, no pooler (sentence-
transformers never reads it), then mean pooling and L2 normalising in float32.

Measured on the 2-vCPU development machine (Intel Xeon, AMX), one LoCoMo question, median of
200, bfloat16: the modules 4.9 ms, this 2.9 ms (cosine to theirs >= 0.99996; in float32 the
same vector to 1e-6, ``tests/unit/test_embedder.py``).

In int8 (``dtype=torch.qint8``, :data:`INT8`) the four matmuls of a layer are fbgemm's dynamic
int8 linear (weights quantized once per output channel, activations per call, int32 sums), and
everything else runs in float32: the weights MiniLM reads per question drop from 21 MB
(bfloat16) to 11 MB, and on the 2-vCPU AMD EPYC (Zen 4, AVX-512 VNNI) a question takes 2.3 ms
instead of 4.0 (bfloat16) and 8.4 (float32), cosine to the float32 vector >= 0.99 (0.97 for a
3-token text). Numbers and recall: docs/BENCHMARKS.md.

Only the shape it was written for is taken (:meth:`BertForward.of` says None otherwise, and
the embedder then calls the modules): Transformer(BertModel with absolute positions and erf
GELU) -> Pooling(mean) -> Normalize.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from inferscale_core.cpu_features import avx512_vnni

INT8 = torch.qint8
"""The ``dtype`` that asks for int8 matmuls (module docstring)."""


@functools.cache
def int8_supported() -> bool:
    """fbgemm's dynamic int8 linear runs on this CPU at full range: an x86 CPU with AVX-512
    VNNI (its int8 dot products sum into int32; AVX2's 16-bit pair sums could saturate on
    8-bit activations, and 7-bit ones cost too much precision: cosine 0.976 to float32 on
    ``tests/unit/test_embedder.py``'s texts, against 0.993), and this PyTorch still has the
    ops (quantized tensors are deprecated: a later PyTorch may drop them)."""
    if not (avx512_vnni() and "fbgemm" in torch.backends.quantized.supported_engines):
        return False
    try:
        _Int8Linear(torch.ones(2, 2), torch.zeros(2))(torch.ones(1, 2))
    except (AttributeError, RuntimeError):  # the ops are gone, or this build lacks them
        return False
    return True


class _Linear:
    """``x @ w.T + b`` in the compute dtype: ``[..., in] -> [..., out]``."""

    __slots__ = ("b", "w")

    def __init__(self, w: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
        self.w = w.detach().to(dtype)  # [out, in]
        self.b = b.detach().to(dtype)  # [out]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w, self.b)


class _Int8Linear:
    """The same with int8 weights (symmetric, one scale per output row) and float32 in and
    out; fbgemm quantizes each call's input to 8 bits over its range (one scale per call)."""

    __slots__ = ("packed",)

    def __init__(self, w: torch.Tensor, b: torch.Tensor) -> None:
        w = w.detach().float()  # [out, in]
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).double()  # [out]
        zeros = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated (int8_supported)
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            q = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(q, b.detach().float())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, False)  # full range


Linear = _Linear | _Int8Linear


@dataclass(frozen=True, slots=True)
class _Layer:
    """One encoder layer (``d`` = hidden, ``f`` = FFN), its norms in the compute dtype."""

    qkv: Linear  # d -> 3d: query, key, value stacked
    out: Linear  # d -> d
    norm1: tuple[torch.Tensor, torch.Tensor]  # ([d], [d]) after attention
    up: Linear  # d -> f
    down: Linear  # f -> d
    norm2: tuple[torch.Tensor, torch.Tensor]  # ([d], [d]) after the FFN


class BertForward:
    """``features -> [b, dim]`` unit rows (float32), as the model's modules compute them.

    Args:
        bert: a transformers ``BertModel`` in eval mode (its weights are read, not copied,
            except Q/K/V, stacked into one matrix).
        dtype: what the layers compute in (the embeddings and the pooling stay float32), or
            :data:`INT8`: int8 matmuls, the rest in float32.
    """

    def __init__(self, bert: Any, dtype: torch.dtype) -> None:
        config = bert.config
        self.heads = int(config.num_attention_heads)
        self.eps = float(config.layer_norm_eps)
        self.dtype = torch.float32 if dtype == INT8 else dtype  # of the activations
        emb = bert.embeddings
        self.words = emb.word_embeddings.weight  # [vocab, d], the model's dtype (no copy)
        self.positions = emb.position_embeddings.weight.float()  # [max_positions, d]
        self.types = emb.token_type_embeddings.weight.float()  # [type_vocab, d]
        self.norm0 = (emb.LayerNorm.weight.float(), emb.LayerNorm.bias.float())

        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(self.dtype)

        def linear(w: torch.Tensor, b: torch.Tensor) -> Linear:
            return _Int8Linear(w, b) if dtype == INT8 else _Linear(w, b, dtype)

        self.layers = []
        for layer in bert.encoder.layer:
            att, out = layer.attention.self, layer.attention.output
            self.layers.append(
                _Layer(
                    qkv=linear(
                        torch.cat([att.query.weight, att.key.weight, att.value.weight]),
                        torch.cat([att.query.bias, att.key.bias, att.value.bias]),
                    ),
                    out=linear(out.dense.weight, out.dense.bias),
                    norm1=(cast(out.LayerNorm.weight), cast(out.LayerNorm.bias)),
                    up=linear(layer.intermediate.dense.weight, layer.intermediate.dense.bias),
                    down=linear(layer.output.dense.weight, layer.output.dense.bias),
                    norm2=(cast(layer.output.LayerNorm.weight), cast(layer.output.LayerNorm.bias)),
                )
            )

    @classmethod
    def of(cls, model: Any, dtype: torch.dtype) -> BertForward | None:
        """The forward of a loaded ``SentenceTransformer`` if it is the supported shape (module
        docstring), else None."""
        modules = [type(module).__name__ for module in model]
        if modules != ["Transformer", "Pooling", "Normalize"]:
            return None
        bert = getattr(model[0], "auto_model", None)
        config = getattr(bert, "config", None)
        if type(bert).__name__ != "BertModel" or config is None:
            return None
        if (
            getattr(config, "position_embedding_type", "absolute") != "absolute"
            or config.hidden_act != "gelu"  # transformers' "gelu" is the erf one, F.gelu's default
            or getattr(config, "is_decoder", False)
        ):
            return None
        if not _mean_pooling(model[1].get_config_dict()):
            return None
        return cls(bert, dtype)

    def __call__(self, features: dict[str, Any]) -> torch.Tensor:
        """``features``: the model's tokenizer output (``input_ids`` and ``attention_mask``
        ``[b, t]``, optional ``token_type_ids``). Returns ``[b, dim]`` float32, unit rows."""
        ids = features["input_ids"]  # [b, t]
        mask = features["attention_mask"]  # [b, t], 1 = a token, 0 = padding
        types = features.get("token_type_ids")
        b, t = ids.shape
        x = self.words[ids].float() + self.positions[:t]  # [b, t, d]
        x = x + (self.types[0] if types is None else self.types[types])
        d = x.shape[-1]
        x = F.layer_norm(x, (d,), *self.norm0, self.eps).to(self.dtype)
        # padded keys are masked out ([b, 1, 1, t], True = attend); none to mask: no mask
        keep = None if bool(mask.all()) else mask[:, None, None, :].bool()
        hd = d // self.heads
        for layer in self.layers:
            qkv = layer.qkv(x)  # [b, t, 3d]
            q, k, v = qkv.view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)  # [b, h, t, hd]
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # [b, h, t, hd]
            att = layer.out(att.transpose(1, 2).reshape(b, t, d))  # [b, t, d]
            x = F.layer_norm(att + x, (d,), *layer.norm1, self.eps)
            y = layer.down(F.gelu(layer.up(x)))  # [b, t, d]
            x = F.layer_norm(y + x, (d,), *layer.norm2, self.eps)  # [b, t, d]
        weights = mask.unsqueeze(-1).float()  # [b, t, 1]
        pooled = (x.float() * weights).sum(1) / weights.sum(1).clamp(min=1e-9)  # [b, d]
        return F.normalize(pooled, dim=-1)


def _mean_pooling(config: dict[str, Any]) -> bool:
    """A Pooling module's config says plain mean pooling (sentence-transformers >= 6 names the
    mode; older ones set one ``pooling_mode_*`` flag)."""
    if "pooling_mode" in config:
        return config["pooling_mode"] == "mean" and config.get("include_prompt", True)
    flags = {key for key, value in config.items() if key.startswith("pooling_mode_") and value}
    return flags == {"pooling_mode_mean_tokens"} and config.get("include_prompt", True)
