"""GPU encoding throughput: all of LoCoMo's facts encoded per second through the serving engine.

``python -m bench.gpu_encode OUT_DIR --tokenizer DIR --data locomo10.json`` starts the product's
engine on dummy weights of a model shape of :data:`~bench.dummy.SHAPES` (vLLM's
``load_format="dummy"``: latency does not depend on the weights' values) and encodes every
LoCoMo observation (2,541 in ``locomo10.json``) after its context window (``20``: the 20
turns before it; ``20a``: the anchored window of w=20, whose shared turns come from vLLM's
prefix cache) through the product's path:
:class:`~inferscale_core.prompt_builder.PromptBuilder` (token layout, context windows, waves of
``--batch-size`` facts in order) over
:class:`~inferscale_core.encoding.EngineEncoder`: one prefill request per fact, the fact's K/V
captured from the paged cache by the connector and written to the KVStore (host copy, one
safetensors file per fact). The time counts until every entry is written.

One shape per run (a process holds one engine). ``--device cpu --limit 3`` with the
``tiny-llama`` shape is a smoke run on a CPU. The result is ``OUT_DIR/gpu_encode.json``. The
tokenizer is SmolLM2's (its ids are below every shape's vocabulary).

The GPU image has torch and transformers but not the product's pure-Python dependencies of the
LoCoMo import (sqlite-utils, sqlite-fts4, click, python-dateutil, ijson, platformdirs, pluggy);
copy those packages into a git-ignored folder and put it on ``PYTHONPATH`` after the repository::

    PYTHONPATH="$(pwd):$(pwd)/.gpu/pydeps" python3 -m bench.gpu_encode "$OUT" \\
        --tokenizer .gpu/tok --data .gpu/data/locomo10.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.arguments import parse_windows
from bench.dummy import SHAPES, write_dummy_config
from bench.encode import encode_rows, locomo_facts, sample_facts
from bench.locomo_data import LocomoDataMissingError, require
from bench.report import provenance, write_json

TARGET_S = 42.0  # the Hugging Face copy's time for all of LoCoMo at w=20 (8B shape, H200)
TARGET_ANCHORED_S = 15.0  # the anchored window of w=20 (fewer tokens: under the floor)
TARGET_W = 20
FLOOR_TFLOPS = 790.0  # the H200's practical bf16 peak (device notes)
DATA_HELP = (
    "locomo10.json (default: $INFERSCALE_LOCOMO, else ../shared/data/locomo/ beside the checkout)"
)


def run_gpu_encode(
    tokenizer_dir: Path,
    data: Path,
    shape: str,
    ws: Sequence[int | str],
    *,
    batch_size: int = 64,
    layers: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    warmup: int | None = None,
    gpu_memory_utilization: float = 0.5,
    step_tokens: int | None = None,
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
    on_checkpoint: Callable[[dict[str, Any]], None] = lambda result: None,
) -> dict[str, Any]:
    """Measure every w; the JSON-ready result (``{"bench": "gpu-encode", …}``).

    ``layers`` overrides the shape's layer count; ``limit`` encodes a seeded sample per w and
    extrapolates to all facts; ``warmup`` facts (default: one wave) are encoded untimed first.
    """
    from transformers import AutoTokenizer

    from inferscale_core import wiring
    from inferscale_core.composer import ChatLayout
    from inferscale_core.encoding import EngineEncoder
    from inferscale_core.prompt_builder import PromptBuilder, default_system_prompt

    if shape not in SHAPES or not ws:
        raise ValueError(f"need a known shape {list(SHAPES)} and at least one w")
    cuda = torch.cuda.is_available()
    warmup = batch_size if warmup is None else warmup
    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"num_hidden_layers": layers} if layers else None
        model_dir = write_dummy_config(Path(tmp) / shape, shape, overrides)
        on_progress(f"{shape}: starting the engine on dummy weights")
        store = wiring.open_store(model_dir, Path(tmp) / "kv")
        options: dict[str, Any] = {
            "extra": {"load_format": "dummy", "skip_tokenizer_init": True},
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_num_batched_tokens": step_tokens,  # None: the product's default
        }
        if cuda:
            options["dtype"] = "bfloat16"
        engine = wiring.start_engine(model_dir, store, **options)
        engine.warm_up()
        layout = ChatLayout(
            AutoTokenizer.from_pretrained(str(tokenizer_dir)), default_system_prompt()
        )
        salt = f"inferscale-encode/bench/{store.fingerprint}"
        encoder = EngineEncoder(engine, store, salt)
        builder = PromptBuilder(layout, encoder, store, batch_size=batch_size)
        config = SHAPES[shape]
        params = _params(config, layers)
        result: dict[str, Any] = {
            **provenance("gpu-encode", f"dummy weights: {shape}", command),
            "facts": "LoCoMo observations after their context window (PromptBuilder.encode_many)",
            "path": "EngineEncoder: prefill requests through the serving vLLM engine, the span"
            " captured from the paged cache and written to the KVStore",
            "gpu": torch.cuda.get_device_name() if cuda else None,
            "dtype": "bfloat16" if cuda else "float32",
            "shape": shape,
            "params": params,
            "block_size": engine.block_size,
            "max_num_batched_tokens": engine.step_tokens,
            "batch_size": batch_size,
            "limit": limit,
            "seed": seed,
            "warmup_facts": warmup,
            "target": {
                "w": TARGET_W,
                "all_seconds": TARGET_S,
                "anchored_all_seconds": TARGET_ANCHORED_S,
                "met": None,
                "anchored_met": None,
            },
            "rows": [],
        }
        with locomo_facts(data, on_progress) as (memory, facts):
            chosen = sample_facts(facts, limit, seed)
            rows = encode_rows(
                builder, memory, chosen, len(facts), ws, warmup=warmup, on_progress=on_progress
            )
        for row in rows:
            # Compute floor: 2 FLOP per parameter per prefilled token (the attention part is
            # small here); the tokens the engine computed, else all it was given.
            tokens = row["prefilled_tokens"] or row["fact_tokens"] + row["context_tokens"]
            row["floor_seconds"] = 2 * params * tokens / (FLOOR_TFLOPS * 1e12)
            row["all_floor_seconds"] = row["floor_seconds"] * row["all_facts"] / row["facts"]
            result["rows"].append(row)
            if row["w"] == TARGET_W and row["window"] == "sliding":
                result["target"]["met"] = row["all_seconds"] <= TARGET_S
            if row["w"] == TARGET_W and row["window"] == "anchored":
                result["target"]["anchored_met"] = row["all_seconds"] <= TARGET_ANCHORED_S
        result["captured"] = engine.load_stats.captured if engine.load_stats else None
        on_checkpoint(result)
        engine.close()
    return result


def _params(config: dict[str, Any], layers: int | None) -> int:
    """Parameters of a Llama-shaped config (embeddings counted once if tied)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // heads
    per_layer = h * d * (heads + 2 * kv) + heads * d * h + 3 * h * i + 2 * h
    embeddings = v * h * (1 if config.get("tie_word_embeddings") else 2)
    return (layers or config["num_hidden_layers"]) * per_layer + embeddings + h


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_encode", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True, help="SmolLM2 tokenizer folder")
    parser.add_argument("--data", type=Path, help=DATA_HELP)
    parser.add_argument("--shape", default="llama-3.1-8b", choices=list(SHAPES))
    parser.add_argument(
        "--ws",
        default="0,20,20a",
        help="context windows: 20 = the 20 turns before a fact, 20a = anchored (0,20,20a)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="facts per wave (64)")
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layers")
    parser.add_argument("--limit", type=int, default=None, help="facts per w (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument(
        "--step-tokens", type=int, default=None, help="max_num_batched_tokens (product default)"
    )
    args = parser.parse_args(argv)
    try:
        args.data = require(args.data)
    except LocomoDataMissingError as exc:
        parser.error(str(exc))
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    path = Path(args.out_dir) / "gpu_encode.json"
    result = run_gpu_encode(
        args.tokenizer,
        args.data,
        args.shape,
        parse_windows(args.ws, "--ws"),
        batch_size=args.batch_size,
        layers=args.layers,
        limit=args.limit,
        seed=args.seed,
        gpu_memory_utilization=args.gpu_memory_utilization,
        step_tokens=args.step_tokens,
        command=shlex.join(["python", "-m", "bench.gpu_encode", *(argv or sys.argv[1:])]),
        on_progress=progress,
        on_checkpoint=lambda partial: write_json(partial, path),
    )
    write_json(result, path)
    for row in result["rows"]:
        how = "extrapolated" if row["all_extrapolated"] else "measured"
        print(
            f"{args.shape} w={row['spec']}: {row['facts_per_s']:.1f} facts/s,"
            f" {row['tokens_per_s']:.0f} tokens/s, all {row['all_facts']} in"
            f" {row['all_seconds']:.1f} s ({how}; compute floor {row['all_floor_seconds']:.1f} s)"
        )
    target = result["target"]
    print(f"target (w={TARGET_W}, all facts in {TARGET_S:.0f} s): {target['met']}")
    print(f"target (w={TARGET_W}a, in {TARGET_ANCHORED_S:.0f} s): {target['anchored_met']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
