"""Exactness at tensor parallelism 2 on the CPU, in its own process: the tiny random Llama of
``tiny_llama_check.py`` (4 heads, 2 KV heads: one KV head per rank) through
:func:`tests.support.injection_check.run_checks`, with vLLM's workers in two processes of their
own, each loading and capturing its own KV head (``tp_heads``).

``python tests/support/tp2_check.py WORKDIR TOKENIZER_DIR`` prints the report as one JSON line.
A store already in ``WORKDIR/kv`` (written at TP=1) is served as it is: the encoder skips the
entries it holds. Needs two CPUs; each rank's threads are bound to one of them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(workdir: Path, tokenizer_dir: Path) -> dict:
    from inferscale_core import wiring
    from inferscale_core.vllm_plugin import vllm_engine
    from inferscale_core.vllm_plugin.worker_side import LoadStats
    from tests.support.injection_check import run_checks
    from tests.support.tiny_llama_check import make_tiny_llama

    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, cpus)))
    # The worker sides live in vLLM's worker processes: their counts are out of reach here.
    counts = vllm_engine.VllmEngine.load_stats
    vllm_engine.VllmEngine.load_stats = property(lambda self: counts.fget(self) or LoadStats())
    build = wiring.build

    def build_tp2(*args, **kwargs):
        extra = {**(kwargs.pop("extra", None) or {}), "tensor_parallel_size": 2}
        return build(*args, extra={**extra, "distributed_executor_backend": "mp"}, **kwargs)

    wiring.build = build_tp2
    model_dir = make_tiny_llama(workdir / "tiny-llama", tokenizer_dir)
    return run_checks(model_dir, workdir, rope_type="llama3")


if __name__ == "__main__":  # vLLM's workers start by spawning: they import this file again
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
