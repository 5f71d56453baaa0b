"""``inferscale-assistant bench …``: the benchmarks, where they are installed.

The benches live in the top-level ``bench/`` package of a source checkout, outside the
assistant's wheel (``pip install -e '.[bench]'`` brings them and matplotlib/nltk). In a plain
install the command is still listed, and says how to get them.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

INSTALL_HINT = (
    "the benchmarks are not installed: they live in a source checkout of inferscale-assistant;"
    " run `pip install -e '.[bench]'` there"
)


def _bench_cli():
    """The ``bench.cli`` module: importable in a checkout (editable install, tests), else
    None. An editable install maps only the product's packages, so the checkout's root (the
    folder above ``app/``) is added to the path when it holds ``bench/``."""
    if importlib.util.find_spec("bench") is None:
        root = Path(__file__).resolve().parents[2]
        if not (root / "bench" / "cli.py").is_file():
            return None
        sys.path.append(str(root))
    try:
        import bench.cli
    except ImportError as exc:  # a checkout without the [bench] extra (matplotlib, nltk)
        if getattr(exc, "name", None) in ("matplotlib", "nltk"):
            return None
        raise
    return bench.cli


def register(sub: argparse._SubParsersAction) -> None:
    cli = _bench_cli()
    if cli is not None:
        cli.register(sub)
        return
    parser = sub.add_parser(
        "bench", help="measure TTFT, throughput, tiers, encoding, retrieval, LoCoMo (needs [bench])"
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=_missing)


def _missing(args: argparse.Namespace, console: Console) -> int:
    console.print(f"[red]error:[/red] {escape(INSTALL_HINT)}", soft_wrap=True)
    return 2
