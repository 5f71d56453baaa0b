"""Latency runs on any model shape without its weights: a config-only folder, dummy weights.

Latency does not depend on the weights' values, so the TTFT, throughput and tier benches can
run a Llama-3.1-8B-shaped engine from a ``config.json`` alone (vLLM's ``load_format="dummy"``,
no tokenizer: ``skip_tokenizer_init=True``). Requests are random token ids and the stored
memories random pre-RoPE KV of the right shape, written to the store like encoded facts, so
the connector's whole path (scheduler checks, re-rotation, cache writes) runs as in the
product. Answers are meaningless; accuracy benches need the real model.

``--dummy-config`` takes a built-in shape name (:data:`SHAPES`), a ``config.json`` file or a
folder holding one. ``weights="int4"`` adds the ``quantization_config`` of the 4-bit folders
made from GGUFs (:func:`inferscale_core.gguf_int4.quantization_config`: compressed-tensors
W4A16, asymmetric, group 32), so the dummy load builds 4-bit layers (Marlin on CUDA).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.prompts import recompute_salted
from inferscale_core import wiring
from inferscale_core.composer import ComposedPrompt, PlacedEntry, entry_key
from inferscale_core.kvstore import KVStore
from inferscale_core.types import FactKV

_LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
    "initializer_range": 0.02,
}

#: Built-in shapes: the 8B Llama for the GPU, SmolLM2's own shape and a 2-layer toy for CPU.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _LLAMA_31_8B,
    "smollm2-135m": {
        **_LLAMA_31_8B,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    "tiny-llama": {
        **_LLAMA_31_8B,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
}


#: How the dummy weights are held: bf16 (the config's dtype) or the GGUF folders' int4.
DUMMY_WEIGHTS = ("bf16", "int4")


def dummy_weights_config(config: dict[str, Any], weights: str = "bf16") -> dict[str, Any]:
    """``config`` with the ``quantization_config`` of ``weights`` (none for bf16); the 4-bit
    one needs bf16 or fp16 activations (vLLM's W4A16 kernels), so its dtype becomes bf16."""
    if weights not in DUMMY_WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(DUMMY_WEIGHTS)}; got {weights!r}")
    if weights == "bf16":
        return config
    from inferscale_core.gguf_int4 import quantization_config

    if "quantization_config" in config:
        raise ValueError(f"weights={weights}: the config is quantized already")
    return {
        **config,
        "torch_dtype": "bfloat16",
        "quantization_config": quantization_config(["lm_head"]),
    }


def write_dummy_config(
    folder: Path,
    shape: str = "llama-3.1-8b",
    overrides: dict[str, Any] | None = None,
    weights: str = "bf16",
) -> Path:
    """Write ``folder/config.json`` of a built-in shape, with ``overrides`` (e.g.
    ``{"num_hidden_layers": 2}`` for a CPU smoke run) and ``weights`` (:data:`DUMMY_WEIGHTS`);
    returns the folder."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; built-in shapes: {', '.join(SHAPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    merged = {**SHAPES[shape], **(overrides or {})}
    config = dummy_weights_config({k: v for k, v in merged.items() if v is not None}, weights)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return folder


def resolve_dummy_config(spec: str, work_dir: Path, weights: str = "bf16") -> Path:
    """A config-only model folder from a shape name, a config.json file or a folder, its
    weights held as ``weights`` (a config of another folder is copied to add int4's)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json")
        if weights == "bf16":
            return path
        path = path / "config.json"
    if path.is_file():
        folder = Path(work_dir) / "dummy-model"
        folder.mkdir(parents=True, exist_ok=True)
        if weights == "bf16":
            shutil.copyfile(path, folder / "config.json")
        else:
            config = dummy_weights_config(json.loads(path.read_text()), weights)
            (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        return folder
    if spec in SHAPES:
        return write_dummy_config(Path(work_dir) / spec, spec, weights=weights)
    raise FileNotFoundError(
        f"--dummy-config {spec!r} is neither a file, a folder nor a built-in shape"
        f" ({', '.join(SHAPES)})"
    )


@dataclass(slots=True)
class DummyRuntime:
    model_dir: Path
    fingerprint: str
    store: KVStore
    engine: Any  # VllmEngine
    config: dict[str, Any]

    @property
    def model_name(self) -> str:
        return f"dummy:{self.model_dir.name}"


def open_dummy_runtime(
    model_dir: Path, store_root: Path, gpu_bytes: int = 0, **engine_options: Any
) -> DummyRuntime:
    """An engine with dummy weights and the connector, over a store in ``store_root``."""
    store = wiring.open_store(model_dir, store_root, gpu_bytes)
    extra = {"load_format": "dummy", "skip_tokenizer_init": True}
    extra.update(engine_options.pop("extra", {}))
    engine = wiring.start_engine(model_dir, store, extra=extra, **engine_options)
    engine.warm_up()
    config = json.loads((model_dir / "config.json").read_text())
    return DummyRuntime(model_dir, store.fingerprint, store, engine, config)


class DummyPrompts:
    """A :class:`~bench.prompts.PromptSource` of random ids and random KV.

    Layout as a real request: ``prefix_tokens`` of system prefix, then the facts of
    ``fact_tokens`` each, then ``question_tokens`` of question; every stored entry has the
    model's KV shape ``[layers, tokens, kv_heads, head_dim]`` in ``dtype``.
    """

    def __init__(
        self,
        runtime: DummyRuntime,
        pool_size: int,
        fact_tokens: int = 64,
        prefix_tokens: int = 40,
        question_tokens: int = 24,
        seed: int = 0,
        dtype: torch.dtype | None = None,
    ) -> None:
        import time

        config = runtime.config
        self.pool_size = pool_size
        self.fact_tokens = fact_tokens
        self.question_tokens = question_tokens
        self.description = f"random token ids and random KV, facts of {fact_tokens} tokens"
        self.fingerprint = runtime.fingerprint
        self.cache_salt = f"dummy/{runtime.fingerprint}"
        self.vocab = int(config["vocab_size"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(
            config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        )
        self.shape = (int(config["num_hidden_layers"]), heads, head_dim)
        if dtype is None:
            dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        self.prefix = self._put(runtime.store, ("prefix", seed), prefix_tokens, rng, gen, dtype)
        self.facts = [
            self._put(runtime.store, ("fact", seed, i), fact_tokens, rng, gen, dtype)
            for i in range(pool_size)
        ]
        self.encode_s = time.perf_counter() - t0

    def _put(
        self,
        store: KVStore,
        name: tuple[Any, ...],
        tokens: int,
        rng: random.Random,
        gen: torch.Generator,
        dtype: torch.dtype,
    ) -> tuple[str, list[int]]:
        ids = self._ids(rng, tokens)
        key = entry_key(str(name[0]), self.fingerprint, "dummy", *name[1:], tuple(ids))
        if not store.has(key):
            layers, heads, head_dim = self.shape
            k = torch.randn(layers, tokens, heads, head_dim, generator=gen).to(dtype)
            v = torch.randn(layers, tokens, heads, head_dim, generator=gen).to(dtype)
            store.put(FactKV(key, ids, k, v, self.fingerprint))  # [layers, tokens, heads, dim]
        return key, ids

    def _ids(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(100, self.vocab) for _ in range(n)]

    def pair(
        self, indices: Sequence[int], tag: str, recompute: int = 0
    ) -> tuple[ComposedPrompt, list[int]]:
        question = self._ids(random.Random(tag), self.question_tokens)
        facts = [self.facts[i] for i in indices]
        composed = layout_request(self.prefix, facts, question, self.cache_salt, recompute)
        return composed, list(composed.prompt_ids)


def layout_request(
    prefix: tuple[str, list[int]],
    facts: Sequence[tuple[str, list[int]]],
    question_ids: Sequence[int],
    cache_salt: str,
    recompute: int = 0,
) -> ComposedPrompt:
    """Prefix, facts (``(entry key, ids)``, prompt order) and question as one injected request.

    The last ``recompute`` facts are no entries, only ids: prefilled with the question, after
    the injected span, as :meth:`~inferscale_core.prompt_builder.PromptBuilder.build` lays out
    a hybrid request (the ids are the same for every ``recompute``; its salt is its own:
    :func:`~bench.prompts.recompute_salted`).
    """
    split = len(facts) - min(max(recompute, 0), len(facts))
    prefix_key, prefix_ids = prefix
    ids = list(prefix_ids)
    entries = [PlacedEntry(prefix_key, 0, len(ids))]
    for i, (key, fact_ids) in enumerate(facts):
        if i < split:
            entries.append(PlacedEntry(key, len(ids), len(ids) + len(fact_ids)))
        ids.extend(fact_ids)
    ids.extend(question_ids)
    keys = [e.key for e in entries[1:]]
    composed = ComposedPrompt(ids, entries, keys, cache_salt)
    return recompute_salted(composed, min(max(recompute, 0), len(facts)))
