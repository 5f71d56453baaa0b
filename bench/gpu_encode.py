"""GPU encoding throughput: all of LoCoMo's facts encoded per second, per model shape and w.

``python -m bench.gpu_encode OUT_DIR --tokenizer DIR --data locomo10.json`` builds each model shape
of :data:`~bench.dummy.SHAPES` from its config with random weights
(``AutoModelForCausalLM.from_config``, initialised on the device; latency does not depend on the
weights' values), and encodes every LoCoMo observation (2,541 in ``locomo10.json``) with its ``w``
preceding turns through the product's path: :class:`~inferscale_core.prompt_builder.PromptBuilder`
(token layout, context windows, batches sorted by length) over
:class:`~inferscale_core.encoding.HFReferenceEncoder` (hooks capture pre-RoPE K and V). On CUDA the
model runs in bf16 with ``sdpa`` attention and the entries hold bf16 K/V, the serving cache's dtype.
Two sinks per run:

* ``device``: the entries stay on the GPU (no copy to the host): the encoding itself;
* ``store``: the product's :class:`~inferscale_core.kvstore.KVStore` (host copy, one safetensors
  file per fact with fsync), what the memory worker does after encoding.

``--device cpu --limit 3 --layers 2`` is a smoke run on a CPU (fp32, eager attention). The
result is ``OUT_DIR/gpu_encode.json`` (rewritten after each shape and sink, so a run cut short
keeps what it measured). The tokenizer is SmolLM2's (its ids are below every shape's
vocabulary).

The GPU image has torch and transformers but not the product's pure-Python dependencies of the
LoCoMo import (sqlite-utils, sqlite-fts4, click, python-dateutil, ijson, platformdirs, pluggy);
copy those packages from the venv's site-packages into a git-ignored folder and put it on
``PYTHONPATH`` after the repository (ijson falls back to its pure-Python parser)::

    PYTHONPATH="$(pwd):$(pwd)/.gpu/pydeps" python3 -m bench.gpu_encode "$OUT" \
        --tokenizer .gpu/tok --data .gpu/data/locomo10.json
"""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bench.arguments import parse_ks, parse_names
from bench.dummy import SHAPES, write_dummy_config
from bench.encode import encode_rows, locomo_facts, sample_facts
from bench.locomo_data import LocomoDataMissingError, require
from bench.report import provenance, write_json
from inferscale_core.encoding import HFReferenceEncoder, attention_implementation
from inferscale_core.types import FactKV

if TYPE_CHECKING:
    from inferscale_core.composer import ChatLayout
    from inferscale_core.prompt_builder import PromptBuilder

TARGET_S = 60.0  # all of LoCoMo encoded at TARGET_W within this
TARGET_W = 20
SINKS = ("device", "store")
DATA_HELP = (
    "locomo10.json (default: $INFERSCALE_LOCOMO, else ../shared/data/locomo/ beside the checkout)"
)
WEIGHTS_NOTE = (
    "random weights from the shape's config (AutoModelForCausalLM.from_config, built on the"
    " device): encoding latency does not depend on the weights' values"
)


class DeviceSink:
    """Where the ``device`` sink's entries go: a dict of GPU-resident K/V, nothing copied.

    It has the three methods :class:`~inferscale_core.prompt_builder.PromptBuilder` calls on
    its store.
    """

    def __init__(self) -> None:
        self._entries: dict[str, FactKV] = {}

    def has(self, key: str) -> bool:
        return key in self._entries

    def put(self, entry: FactKV) -> None:
        self._entries[entry.key] = entry  # k, v: [layers, tokens, kv_heads, head_dim]

    def delete(self, key: str) -> bool:
        return self._entries.pop(key, None) is not None


def random_weight_model(
    model_dir: Path, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> torch.nn.Module:
    """The model of ``model_dir/config.json`` with random weights, built on ``device`` directly
    (an 8B model initialised on the CPU first would take minutes)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attention_implementation(device)
        )
    return model.eval()


def run_gpu_encode(
    tokenizer_dir: Path,
    data: Path,
    shapes: Sequence[str],
    ws: Sequence[int],
    *,
    sinks: Sequence[str] = SINKS,
    device: str | None = None,
    batch_size: int = 64,
    layers: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    warmup: int | None = None,
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
    on_checkpoint: Callable[[dict[str, Any]], None] = lambda result: None,
) -> dict[str, Any]:
    """Measure every (shape, sink, w); the JSON-ready result (``{"bench": "gpu-encode", …}``).

    ``device`` defaults to CUDA when present; ``layers`` overrides every shape's layer count;
    ``limit`` encodes a seeded sample per w and extrapolates to all facts; ``warmup`` facts
    (default: one batch) are encoded untimed before each measurement. ``on_checkpoint`` gets
    the result so far after each (shape, sink), so a run cut short still leaves its rows.
    """
    import transformers
    from transformers import AutoTokenizer

    from inferscale_core.composer import ChatLayout
    from inferscale_core.prompt_builder import default_system_prompt

    unknown = [s for s in sinks if s not in SINKS] + [s for s in shapes if s not in SHAPES]
    if unknown or not sinks or not shapes or not ws:
        raise ValueError(
            f"need known sinks {SINKS}, shapes {list(SHAPES)} and at least one w; got"
            f" sinks {list(sinks)}, shapes {list(shapes)}, ws {list(ws)}"
        )
    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    warmup = batch_size if warmup is None else warmup
    result: dict[str, Any] = {
        **provenance("gpu-encode", f"random weights: {', '.join(shapes)}", command),
        "facts": "LoCoMo observations with their w preceding turns (PromptBuilder.encode_many)",
        "weights": WEIGHTS_NOTE,
        "device": str(where),
        "gpu": torch.cuda.get_device_name(where) if where.type == "cuda" else None,
        "dtype": str(dtype).removeprefix("torch."),  # the model's and the stored K/V's
        "attention": attention_implementation(where),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "tokenizer": str(tokenizer_dir),
        "batch_size": batch_size,
        "batching": "sorted by length (context + fact tokens), right-padded",
        "sinks": {
            "device": "K/V stay on the device in the model's dtype (no host copy)",
            "store": "the product's KVStore: host copy + one safetensors file per fact (fsync)",
        },
        "limit": limit,
        "seed": seed,
        "warmup_facts": warmup,
        "target": {"w": TARGET_W, "all_seconds": TARGET_S, "met": {}},
        "models": [],
        "rows": [],
    }
    layout = ChatLayout(AutoTokenizer.from_pretrained(str(tokenizer_dir)), default_system_prompt())
    with (
        locomo_facts(data, on_progress) as (memory, facts),
        tempfile.TemporaryDirectory() as tmp,
    ):
        chosen = sample_facts(facts, limit, seed)
        for shape in shapes:
            overrides = {"num_hidden_layers": layers} if layers else None
            model_dir = write_dummy_config(Path(tmp) / shape, shape, overrides)
            on_progress(f"{shape}: building the model with random weights on {where}")
            t0 = time.perf_counter()
            model = random_weight_model(model_dir, where, dtype, seed)
            if where.type == "cuda":
                torch.cuda.synchronize(where)
            result["models"].append(
                {
                    "shape": shape,
                    "layers": model.config.num_hidden_layers,
                    "params": sum(p.numel() for p in model.parameters()),
                    "init_s": time.perf_counter() - t0,
                }
            )
            for sink in sinks:
                builder = _builder(layout, model, model_dir, sink, Path(tmp) / "kv", batch_size)
                tag = f"{shape} [{sink}]"
                rows = encode_rows(
                    builder,
                    memory,
                    chosen,
                    len(facts),
                    ws,
                    warmup=warmup,
                    on_progress=lambda message, tag=tag: on_progress(f"{tag} {message}"),
                )
                for row in rows:
                    met = row["all_seconds"] <= TARGET_S
                    result["rows"].append({"shape": shape, "sink": sink, **row, "target_met": met})
                    if row["w"] == TARGET_W:
                        result["target"]["met"][f"{shape}/{sink}"] = met
                del builder
                on_checkpoint(result)
            del model  # the next shape gets the whole device
            gc.collect()
            if where.type == "cuda":
                torch.cuda.empty_cache()
    return result


def _builder(
    layout: ChatLayout,
    model: torch.nn.Module,
    model_dir: Path,
    sink: str,
    store_root: Path,
    batch_size: int,
) -> PromptBuilder:
    """The product's prompt builder over ``model``, writing its entries to ``sink``."""
    from inferscale_core.fingerprint import model_fingerprint
    from inferscale_core.kvstore import KVStore
    from inferscale_core.prompt_builder import PromptBuilder

    fingerprint = model_fingerprint(model_dir)
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    on_device = sink == "device"
    encoder = HFReferenceEncoder.from_model(
        model, fingerprint, kv_dtype=dtype, kv_device=str(device) if on_device else "cpu"
    )
    store: Any = (
        DeviceSink() if on_device else KVStore(store_root / fingerprint, fingerprint=fingerprint)
    )
    return PromptBuilder(layout, encoder, store, batch_size=batch_size)


def _row_line(row: dict[str, Any]) -> str:
    how = "extrapolated" if row["all_extrapolated"] else "measured"
    return (
        f"{row['shape']} [{row['sink']}] w={row['w']}: {row['facts_per_s']:.1f} facts/s,"
        f" {row['tokens_per_s']:.0f} tokens/s, all {row['all_facts']} in"
        f" {row['all_seconds']:.1f} s ({how})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_encode", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True, help="SmolLM2 tokenizer folder")
    parser.add_argument("--data", type=Path, help=DATA_HELP)
    parser.add_argument("--shapes", default="smollm2-135m,llama-3.1-8b")
    parser.add_argument("--ws", default="0,20", help="context sizes w (turns before the fact)")
    parser.add_argument("--sinks", default=",".join(SINKS))
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=None, help="override every shape's layers")
    parser.add_argument("--limit", type=int, default=None, help="facts per w (default: all)")
    parser.add_argument("--seed", type=int, default=0)
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
        parse_names(args.shapes),
        parse_ks(args.ws, "--ws"),
        sinks=parse_names(args.sinks),
        device=args.device,
        batch_size=args.batch_size,
        layers=args.layers,
        limit=args.limit,
        seed=args.seed,
        command=shlex.join(["python", "-m", "bench.gpu_encode", *(argv or sys.argv[1:])]),
        on_progress=progress,
        on_checkpoint=lambda partial: write_json(partial, path),
    )
    write_json(result, path)
    for row in result["rows"]:
        print(_row_line(row))
    print(f"target (w={TARGET_W}, all facts in {TARGET_S:.0f} s): {result['target']['met']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
