"""Where a k=50 injected request spends its time beyond the query alone (k=0), in one engine.

``SUITE_PARTS=anatomy`` in ``gpu_run.sh`` runs it on the suite's 8B-shaped engine. For the
modes k=0 (injection: the system prefix is loaded), query0 (the same prompt all prefilled: no
connector work, the query-only baseline), k=5 and k=50 (injection), and the warm identical k=50
prompt (prefix caching's best case: nothing loaded), it measures:

* ``ttft_ms``: TTFT without any profiler, every mode in turn within each repetition, with
  ``paired_ratios`` (k=50 / k=0 and the like, taken within each repetition, then the median)
  and ``connector_us``, the connector's own CPU time, timed from outside around its calls:
  the scheduler side (``scheduler_us``: the plan and the block ids after vLLM's allocation)
  and the worker (``load_us``: the whole load); both again after the profilers (``*_after``);
* ``vllm_us``: vLLM's own CPU time per request by phase (intake: the inputs, the output
  processor, the ``Request`` with its block hashes, the scheduler's queue; scheduling: the
  prefix-cache lookup, the block allocation; the model runner's state update, input
  preparation, forward, sampling; the output processing), timed with ``perf_counter`` by
  wrapping those methods of this engine's objects for one pass (``phase_runs``), so the part of
  the gap that is vLLM's is attributed without a profiler's inflation;
* ``gpu_us``: GPU kernel time per request (``torch.profiler``, CUDA activity only), in total
  and for the kernels that differ between modes (attention, the load kernel), so the GPU's part
  of the gap to k=0 is known;
* ``python_us``: per-request CPU time of each Python function (``cProfile``, one profiler per
  mode, interleaved), and the functions whose own time grows most from k=0, so the CPU's part is
  attributed to vLLM's request handling or to the connector;
* ``timeline``: on a GPU, one ``torch.profiler`` trace (CPU ops, vLLM's own scopes, CUDA) of a
  few requests of k=0, k=``large`` and the warm prompt, summarized per request by
  :func:`summarize_trace` (when the first kernel starts, how long the GPU is busy and idle, when
  the load kernel runs against the forward, how long the host waits on the GPU), so it is known
  which of the gap's parts sit on the critical path. Traces: ``OUT_DIR/trace-<mode>.json.gz``.

Results: ``OUT_DIR/anatomy.json`` and a readable ``OUT_DIR/anatomy.txt``.
"""

from __future__ import annotations

import contextlib
import cProfile
import gzip
import json
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bench.probes import MethodClock, connector_clock

# The phases of one request, by the vLLM / connector function that does each (cumulative time).
PHASES = {
    "add_request": "llm_engine.py:add_request",
    "schedule": "scheduler.py:schedule",
    "connector_match": "scheduler_side.py:get_num_new_matched_tokens",
    "connector_meta": "scheduler_side.py:build_connector_meta",
    "execute_model": "gpu_worker.py:execute_model",
    "connector_load": "worker_side.py:start_load_kv",
    "sample_tokens": "gpu_worker.py:sample_tokens",
    "update_from_output": "scheduler.py:update_from_output",
    "process_outputs": "output_processor.py:process_outputs",
}


# vLLM's request path, timed by wrapping these methods of one engine's objects: (phase, the
# object's path from the LLMEngine, the method). Inclusive times; a phase whose object or
# method this vLLM lacks is reported as missing.
_RUNNER = "engine_core.engine_core.model_executor.driver_worker.worker.model_runner"
_SCHEDULER = "engine_core.engine_core.scheduler"
VLLM_PHASES = (
    ("intake", "", "add_request"),
    ("intake.inputs", "input_processor", "process_inputs"),
    ("intake.output_processor", "output_processor", "add_request"),
    ("intake.request_and_block_hashes", "engine_core.engine_core", "preprocess_add_request"),
    ("intake.scheduler_queue", _SCHEDULER, "add_request"),
    ("step", "", "step"),
    ("schedule", _SCHEDULER, "schedule"),
    ("schedule.prefix_cache_lookup", _SCHEDULER + ".kv_cache_manager", "get_computed_blocks"),
    ("schedule.allocate_blocks", _SCHEDULER + ".kv_cache_manager", "allocate_slots"),
    ("runner.execute_model", _RUNNER, "execute_model"),
    ("runner.update_states", _RUNNER, "_update_states"),
    ("runner.prepare_inputs", _RUNNER, "_prepare_inputs"),
    ("runner.sample_tokens", _RUNNER, "sample_tokens"),
    ("update_from_output", _SCHEDULER, "update_from_output"),
    ("process_outputs", "output_processor", "process_outputs"),
)


def _vllm_phases(
    suite: AnatomySource, modes: dict[str, Callable[[], Any]], runs: int
) -> dict[str, Any]:
    """vLLM's CPU time per request by phase (median us per mode; see ``VLLM_PHASES``)."""
    llm_engine = getattr(getattr(suite, "engine", None), "_engine", None)
    if llm_engine is None:
        return {"skipped": "the suite exposes no in-process vLLM engine"}
    clock = MethodClock()
    samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
    try:
        clock.wrap_all(llm_engine, VLLM_PHASES)
        for _ in range(runs):
            for mode, make in modes.items():
                prompt = make()
                clock.current.clear()
                suite._ttft(prompt)
                for phase, us in clock.current.items():
                    samples[mode].setdefault(phase, []).append(us)
    finally:
        clock.restore()
    out: dict[str, Any] = {
        mode: {phase: round(statistics.median(v), 1) for phase, v in parts.items()}
        for mode, parts in samples.items()
    }
    out["missing"] = clock.missing
    return out


class AnatomySource(Protocol):
    """What the anatomy needs of a suite: fresh composed requests of k facts, and TTFT."""

    def request(self, k: int) -> Any: ...

    def _ttft(self, prompt: Any) -> tuple[float, Any]: ...


def _modes(suite: AnatomySource, small: int, large: int) -> dict[str, Callable[[], Any]]:
    warm = suite.request(large).prompt_ids
    suite._ttft(warm)  # prime the prefix cache with the identical prompt
    return {
        "k0": lambda: suite.request(0),
        # The same prompt as k=0 (system prefix and question), all prefilled: no connector work
        # at all, the query-only baseline.
        "query0": lambda: suite.request(0).prompt_ids,
        f"k{small}": lambda: suite.request(small),
        f"k{large}": lambda: suite.request(large),
        f"warm{large}": lambda: warm,
    }


def _wall(
    suite: AnatomySource, modes: dict[str, Callable[[], Any]], runs: int
) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, float]]:
    """TTFT medians (ms) per mode; the connector's own CPU time per mode (median us, timed
    from outside around its two sides' calls: ``scheduler_us`` deciding the load and recording
    the blocks, ``load_us`` the worker's load); and ratios between modes taken within each
    repetition, then their median (paired: the host's drift between repetitions cancels)."""
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    host: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
    engine = getattr(suite, "engine", None)
    clock_context = connector_clock(engine) if engine is not None else contextlib.nullcontext()
    with clock_context as clock:
        for _ in range(runs):
            for mode, make in modes.items():
                prompt = make()
                if clock is not None:
                    clock.take()
                ttft, _ = suite._ttft(prompt)
                samples[mode].append(ttft)
                for part, us in (clock.take() if clock is not None else {}).items():
                    host[mode].setdefault(part, []).append(us)
    medians = {mode: statistics.median(values) * 1e3 for mode, values in samples.items()}
    host_us = {
        mode: {part: round(statistics.median(v), 1) for part, v in parts.items()}
        for mode, parts in host.items()
    }
    order = list(modes)  # k0, query0, k_small, k_large, warm_large
    paired = {}
    for i, base in enumerate(order):
        for top in order[i + 1 :]:
            ratios = [a / b for a, b in zip(samples[top], samples[base], strict=True)]
            paired[f"{top}/{base}"] = round(statistics.median(ratios), 4)
    return medians, host_us, paired


def _gpu(suite: AnatomySource, modes: dict[str, Callable[[], Any]], runs: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device: the GPU's part is measured on a GPU only"}
    for mode, make in modes.items():
        prompts = [make() for _ in range(runs)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for prompt in prompts:
                suite._ttft(prompt)
        kernels = {
            e.key: (e.device_time_total / runs, e.count / runs)
            for e in prof.key_averages()
            if e.device_time_total > 0
        }
        out[mode] = {
            "total_us": sum(us for us, _ in kernels.values()),
            "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]),
        }
    return out


def _label(func: tuple[str, int, str]) -> str:
    file, line, name = func
    return f"{Path(file).name}:{name}" if file != "~" else name


def _python(suite: AnatomySource, modes: dict[str, Callable[[], Any]], runs: int) -> dict[str, Any]:
    # The engine's work (vLLM's request path and the connector) runs on the engine's own
    # thread: each profiler is switched on and off there.
    on_engine = getattr(getattr(suite, "engine", None), "on_engine_thread", lambda fn: fn())
    profilers = {mode: cProfile.Profile() for mode in modes}
    for _ in range(runs):
        for mode, make in modes.items():
            prompt = make()
            on_engine(profilers[mode].enable)
            suite._ttft(prompt)
            on_engine(profilers[mode].disable)
    own: dict[str, dict[str, tuple[float, float]]] = {}  # mode -> label -> (own us, calls)
    cumulative: dict[str, dict[str, float]] = {}
    for mode, profiler in profilers.items():
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        own[mode], cumulative[mode] = {}, {}
        for func, (_, calls, tottime, cumtime, _) in stats.items():
            label = _label(func)
            prev_own, prev_calls = own[mode].get(label, (0.0, 0.0))
            own[mode][label] = (prev_own + tottime * 1e6 / runs, prev_calls + calls / runs)
            cumulative[mode][label] = max(cumulative[mode].get(label, 0.0), cumtime * 1e6 / runs)
    out: dict[str, Any] = {"total_us": {m: sum(us for us, _ in own[m].values()) for m in modes}}
    out["phases_us"] = {
        m: {phase: cumulative[m].get(label, 0.0) for phase, label in PHASES.items()} for m in modes
    }
    base = own["k0"]
    out["growth_over_k0_us"] = {}
    for mode in modes:
        if mode == "k0":
            continue
        growth = {
            label: (us - base.get(label, (0.0, 0.0))[0], calls)
            for label, (us, calls) in own[mode].items()
        }
        top = sorted(growth.items(), key=lambda kv: -kv[1][0])[:30]
        out["growth_over_k0_us"][mode] = {label: [round(d, 1), c] for label, (d, c) in top}
    return out


# CUDA runtime calls in which the host waits for the GPU.
_HOST_WAITS = (
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cudaMemcpy",
)


def _interval_union(spans: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def summarize_trace(events: list[dict[str, Any]], label: str = "request ") -> list[dict[str, Any]]:
    """Per request span (a CPU event named ``label...``) of a chrome trace: its wall time, when
    its first and last GPU kernels start and end, the GPU's busy time (union of kernels and
    copies) and idle time inside the span, the load kernel's start and length, the host's waits
    on the GPU, and vLLM's scopes (``gpu_model_runner: ...``, ``schedule: ...``). Microseconds,
    from the span's start."""
    spans = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith(label)]
    gpu = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    cpu = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
    ]
    out = []
    for span in spans:
        t0, t1 = span["ts"], span["ts"] + span["dur"]
        inside = [e for e in gpu if t0 <= e["ts"] < t1]
        kernels = sorted((e["ts"] - t0, e["ts"] + e["dur"] - t0, e["name"]) for e in inside)
        load = [k for k in kernels if "inject" in k[2]]
        waits: dict[str, float] = {}
        scopes: dict[str, float] = {}
        for e in cpu:
            if not t0 <= e["ts"] < t1:
                continue
            name = str(e["name"])
            if name.startswith(_HOST_WAITS):
                waits[name] = waits.get(name, 0.0) + e["dur"]
            elif ": " in name and not name.startswith(label):
                scopes[name] = scopes.get(name, 0.0) + e["dur"]
        row: dict[str, Any] = {"name": span["name"], "wall_us": span["dur"]}
        if kernels:
            busy = _interval_union([(a, b) for a, b, _ in kernels])
            first, last_end = kernels[0][0], max(b for _, b, _ in kernels)
            row |= {
                "first_gpu_us": first,
                "last_gpu_end_us": last_end,
                "gpu_busy_us": busy,
                "gpu_idle_between_us": last_end - first - busy,
                "kernels": len(kernels),
            }
        if load:
            after = [k for k in kernels if k[0] >= load[-1][1]]
            row["load_kernel"] = {
                "start_us": load[0][0],
                "us": sum(b - a for a, b, _ in load),
                "next_kernel_gap_us": after[0][0] - load[-1][1] if after else None,
            }
        row["host_waits_us"] = {
            k: round(v, 1) for k, v in sorted(waits.items(), key=lambda kv: -kv[1])
        }
        row["scopes_us"] = {
            k: round(v, 1) for k, v in sorted(scopes.items(), key=lambda kv: -kv[1])
        }
        out.append(row)
    return out


def _timeline(
    suite: AnatomySource,
    modes: dict[str, Callable[[], Any]],
    out: Path,
    traced: tuple[str, ...],
    reps: int = 4,
) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device: the timeline is a GPU trace"}
    from torch.profiler import ProfilerActivity, profile, record_function

    # vLLM's own scopes ("gpu_model_runner: forward", ...) into the trace, for this part only.
    from vllm.v1 import utils as vllm_v1_utils  # the suite runs on vLLM

    saved = vllm_v1_utils._PROFILER_FUNC
    vllm_v1_utils._PROFILER_FUNC = record_function
    result: dict[str, Any] = {}
    try:
        for mode in traced:
            prompts = [modes[mode]() for _ in range(reps)]
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i, prompt in enumerate(prompts):
                    with record_function(f"request {mode} {i}"):
                        suite._ttft(prompt)
            path = out / f"trace-{mode}.json"
            prof.export_chrome_trace(str(path))
            data = path.read_bytes()
            path.unlink()
            (out / f"trace-{mode}.json.gz").write_bytes(gzip.compress(data))
            result[mode] = summarize_trace(json.loads(data)["traceEvents"])
    finally:
        vllm_v1_utils._PROFILER_FUNC = saved
    return result


def _host_probe(repeats: int = 2000) -> dict[str, Any]:
    """The same kinds of host calls the load makes, timed in a tight loop between requests
    (median us): set beside ``connector_us``, they say whether those calls are slow on this
    host in general or only inside a step. Also the process's threads (another runnable
    Python thread would take the GIL at every torch call)."""
    import threading

    import numpy as np
    import torch

    out: dict[str, Any] = {"threads": sorted(t.name for t in threading.enumerate())}

    def median_us(fn: Callable[[], Any]) -> float:
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return round(statistics.median(samples) * 1e6, 2)

    values = np.arange(50, dtype=np.int64)
    out["numpy_cumsum_50_us"] = median_us(lambda: np.cumsum(values))
    out["python_sum_1000_us"] = median_us(lambda: sum(range(1000)))
    if not torch.cuda.is_available():
        return out
    host = torch.empty(4096, dtype=torch.int64, pin_memory=True)
    device = torch.empty(4096, dtype=torch.int64, device="cuda")
    event = torch.cuda.Event()
    out["current_stream_us"] = median_us(torch.cuda.current_stream)
    out["pinned_copy_4k_us"] = median_us(lambda: device[:512].copy_(host[:512], non_blocking=True))
    out["event_record_us"] = median_us(event.record)
    torch.cuda.synchronize()
    return out


def _text(result: dict[str, Any]) -> str:
    lines = ["TTFT without profiler, median (ms), before / after the profilers:"]
    lines += [
        f"  {mode:7s} {ms:8.3f} / {result['ttft_ms_after'][mode]:8.3f}"
        for mode, ms in result["ttft_ms"].items()
    ]
    lines.append("Ratios within each repetition, median, before / after:")
    lines += [
        f"  {name:12s} {r:7.4f} / {result['paired_ratios_after'][name]:7.4f}"
        for name, r in result["paired_ratios"].items()
    ]
    lines.append("The connector's own CPU time per request, median (us), before / after:")
    for mode, parts in result["connector_us"].items():
        if not parts:  # nothing was loaded (the warm prompt)
            continue
        after = result["connector_us_after"].get(mode, {})
        lines.append(
            f"  {mode:7s} "
            + ", ".join(
                f"{p} {us:.1f} / {after.get(p, float('nan')):.1f}" for p, us in parts.items()
            )
        )
    lines.append(f"Host calls in a tight loop, between requests (us): {result['host_probe']}")
    phases = result["vllm_us"]
    if "skipped" in phases:
        lines.append(f"vLLM's phases skipped: {phases['skipped']}")
    else:
        timed = [mode for mode in result["ttft_ms"] if mode in phases]
        lines.append("vLLM's own CPU time per request by phase, median (us; inclusive):")
        lines.append("  " + " " * 32 + "".join(f"{mode:>10s}" for mode in timed))
        for phase, _, _ in VLLM_PHASES:
            if phase in phases["missing"]:
                continue
            cells = "".join(f"{phases[mode].get(phase, 0.0):10.1f}" for mode in timed)
            lines.append(f"  {phase:32s}{cells}")
        if phases["missing"]:
            lines.append(f"  not in this vLLM: {', '.join(phases['missing'])}")
    lines.append("GPU kernel time per request (us), top kernels:")
    for mode, gpu in result["gpu_us"].items():
        if mode == "skipped":
            lines.append(f"  skipped: {gpu}")
            continue
        lines.append(f"  {mode}: total {gpu['total_us']:.1f}")
        for name, (us, count) in list(gpu["kernels"].items())[:8]:
            lines.append(f"      {us:9.1f} us  x{count:6.1f}  {name[:90]}")
    py = result["python_us"]
    lines.append("Python (cProfile) per request (us): total and phases (cumulative)")
    for mode, total in py["total_us"].items():
        phases = ", ".join(f"{p} {us:.0f}" for p, us in py["phases_us"][mode].items())
        lines.append(f"  {mode}: total {total:.0f}; {phases}")
    for mode, growth in py["growth_over_k0_us"].items():
        lines.append(f"Own-time growth over k0, {mode} (us per request, calls per request):")
        lines += [f"  {d:9.1f}  x{c:7.1f}  {label}" for label, (d, c) in growth.items()]
    timeline = result.get("timeline", {})
    if "skipped" in timeline:
        lines.append(f"Timeline skipped: {timeline['skipped']}")
    for mode, rows in timeline.items():
        if mode == "skipped" or not rows:
            continue
        row = rows[-1]  # the last of the traced requests, after the others warmed the path
        lines.append(f"Timeline, {row['name']} (us from the request's start):")
        lines.append(
            "  " + ", ".join(f"{k} {v:.0f}" for k, v in row.items() if isinstance(v, float | int))
        )
        if "load_kernel" in row:
            lines.append(f"  load kernel: {row['load_kernel']}")
        lines.append(f"  host waits: {row['host_waits_us']}")
        lines.append(f"  scopes: {dict(list(row['scopes_us'].items())[:12])}")
    return "\n".join(lines) + "\n"


def run(
    suite: AnatomySource,
    out: Path,
    runs: int = 100,
    small: int = 5,
    large: int = 50,
    profiled_runs: int = 20,
    phase_runs: int = 50,
) -> dict[str, Any]:
    """Measure the modes k=0, query0, k=``small``, k=``large`` and the warm k=``large`` prompt:
    ``runs`` repetitions without profiler (before and after the profilers), ``phase_runs`` with
    vLLM's phases timed, ``profiled_runs`` under each profiler."""
    modes = _modes(suite, small, large)
    for _ in range(3):  # warm-up of every path
        for make in modes.values():
            suite._ttft(make())
    result: dict[str, Any] = {"runs": runs, "profiled_runs": profiled_runs}
    result["ttft_ms"], result["connector_us"], result["paired_ratios"] = _wall(suite, modes, runs)
    result["host_probe"] = _host_probe()
    result["vllm_us"] = _vllm_phases(suite, modes, phase_runs)
    result["gpu_us"] = _gpu(suite, modes, min(profiled_runs, 10))
    result["python_us"] = _python(suite, modes, profiled_runs)
    result["timeline"] = _timeline(suite, modes, out, ("k0", f"k{large}", f"warm{large}"))
    # The host's drift during the profilers: the same measurement again.
    after = _wall(suite, modes, runs)
    result["ttft_ms_after"], result["connector_us_after"], result["paired_ratios_after"] = after
    text = _text(result)
    (out / "anatomy.json").write_text(json.dumps(result, indent=1))
    (out / "anatomy.txt").write_text(text)
    print(text, flush=True)
    return result
