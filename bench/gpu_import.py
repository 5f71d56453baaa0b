"""``python -m bench.gpu_import OUT``: ``bench import`` on a GPU, the 8B shape.

The CPU's ``inferscale-assistant bench import`` (:mod:`bench.import_time`) measures from dropping
a 10k-turn chat export into the inbox until its facts are retrievable and answered from
(``usable``) and until every fact is encoded (``fully_encoded``), eager (every fact encoded) and
lazy (the default: only the recent ones; the rest when first retrieved). Here the same run, the
same export and the same code paths (the real inbox watcher, the session's memory worker, the
engine's encoding, the KV store in ``kv_store_dtype``), on dummy weights of a model shape
(``--dummy-config``, default the Llama-3.1-8B shape) with a SmolLM2 tokenizer and the hashing
embedder of :mod:`bench.app_path` (the GPU image has no MiniLM: the probes are found by their
names, which both the hashing vectors and BM25 see, so "usable" measures the import, not the
embedder). Writes ``OUT/import_gpu.json``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.app_path import HashEmbedder
from bench.report import write_json


def main(argv: Sequence[str] | None = None) -> int:
    from bench import import_time
    from bench.dummy import SHAPES, resolve_dummy_config
    from inferscale_core import paths, wiring
    from inferscale_core.config import AppConfig

    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_import", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--dummy-config",
        default="llama-3.1-8b",
        help=f"dummy weights of a shape ({', '.join(SHAPES)}; llama-3.1-8b)",
    )
    parser.add_argument("--tokenizer", type=Path, required=True, help="a SmolLM2 tokenizer folder")
    parser.add_argument("--turns", type=int, default=10_000, help="turns in the export (10,000)")
    parser.add_argument("--days", type=int, default=1095, help="days they span (1095)")
    parser.add_argument("--probes", type=int, default=10, help="probe questions (10)")
    parser.add_argument("--encode-limit", type=float, default=240.0, help="eager's limit, s")
    parser.add_argument("--lazy-limit", type=float, default=240.0, help="lazy's limit, s")
    parser.add_argument("--modes", default="eager,lazy", help="eager,lazy")
    parser.add_argument("--gpu-gib", type=float, default=40.0, help="GPU memory budget (40)")
    parser.add_argument("--pool-gib", type=float, default=2.0, help="GPU pool of memories (2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this bench runs on a GPU; on the CPU: inferscale-assistant bench import")
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        # a fresh home (fact logs, inboxes, settings), as the CLI's bench import makes one
        os.environ[paths.HOME_ENV] = str(Path(tmp) / "home")
        model_dir = resolve_dummy_config(args.dummy_config, Path(tmp), "bf16")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(args.tokenizer / name, model_dir / name)
        # the deterministic extractor, as on the CPU: an LLM's on dummy weights extracts noise
        config = AppConfig(
            model=str(model_dir), gpu_pool_gib=args.pool_gib, extractor="deterministic"
        )
        total = torch.cuda.mem_get_info()[1] / 2**30
        options: dict[str, Any] = {
            "extra": {"load_format": "dummy", "skip_tokenizer_init": True},
            "gpu_memory_utilization": (args.gpu_gib - args.pool_gib - 1.5) / total,
            "dtype": "bfloat16",
        }
        progress("building the assistant")
        assistant = wiring.build(config, store_root=Path(tmp) / "kv", **options)
        command = shlex.join(["python", "-m", "bench.gpu_import", *(argv or sys.argv[1:])])
        result = import_time.run_import(
            assistant,
            config,
            Path(tmp),
            turns=args.turns,
            days=args.days,
            probes=args.probes,
            limit=args.encode_limit,
            lazy_limit=args.lazy_limit,
            modes=[m for m in args.modes.split(",") if m],
            seed=args.seed,
            embedder=HashEmbedder(),
            model_name=f"dummy weights: {args.dummy_config}",
            command=command,
            on_progress=progress,
        )
        result["gpu"] = torch.cuda.get_device_name()
        result["embedder"] = HashEmbedder.name
    path = args.out_dir / "import_gpu.json"
    write_json(result, path)
    print(import_time.headline(result))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
