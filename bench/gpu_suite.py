"""GPU suite: KV injection vs prompt injection on a Llama-3.1-8B-shaped engine (vLLM 0.26).

``python -m bench.gpu_suite OUT_DIR`` (see ``gpu_run.sh`` beside it) builds
one engine with dummy weights (latency does not depend on weight values), fills the KV store
with synthetic pre-RoPE entries (random K/V, random token ids: the connector checks ids, not
meaning), and measures in that one engine and run:

* TTFT for k in {0, 5, 15, 25, 50, 100} facts of 55 tokens + a 64-token question: injection,
  prompt injection with prefix caching on (fresh facts every run), and the warm identical prompt
  (prefix caching's best case); first streamed token, and ``LLM.generate`` wall time;
* the connector's own load time per request (GPU-pool tier and host tier), with the fused
  kernel and (``SUITE_UNFUSED=1``) with the unfused per-layer path;
* throughput of 100 concurrent users, k=50 each (distinct sets), 32 output tokens;
* (``SUITE_PARTS=recompute``, not run by default) TTFT of the tail-recompute hybrid at k in
  {20, 50}: injection with the last r in {0, 1, 2, 4, 8} facts prefilled with the question
  instead of injected (r=0: plain injection), beside prompt injection at the same k
  (``SUITE_RECOMPUTE_KS``, ``SUITE_RECOMPUTE_RS`` change the grid; :meth:`Suite.recompute`).

``SUITE_PARTS`` picks parts (see :func:`chosen_parts`; ``anatomy`` is :mod:`.step_anatomy`).
``SUITE_CUDAGRAPH_MODE`` (e.g. ``FULL``) sets vLLM's ``compilation_config.cudagraph_mode``;
``SUITE_BLOCK_SIZE`` (e.g. ``64``) the KV-cache block size; ``SUITE_KV_CACHE_DTYPE=fp8`` runs
vLLM's fp8 KV cache (entries then fp8, as that cache holds them); ``SUITE_STORE_DTYPE`` how
the entries are stored (model | fp8 | int4).

Results go to ``OUT_DIR/gpu_suite.json``. Exactness on the GPU is checked separately on a tiny
random Llama (``tests/tiny_llama_check.py --dtype bfloat16``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.arguments import parse_ks, parse_names
from bench.dummy import SHAPES, dummy_weights_config, layout_request
from bench.probes import MethodClock
from bench.report import percentile
from inferscale_core import wiring
from inferscale_core.composer import ComposedPrompt, entry_key
from inferscale_core.fingerprint import model_fingerprint
from inferscale_core.kvstore import KVStore
from inferscale_core.types import FactKV
from inferscale_core.vllm_plugin.fp8_cache import fp8_format

LLAMA_31_8B = SHAPES["llama-3.1-8b"]  # the shape of the kit's baseline
FACT_TOKENS, QUESTION_TOKENS, PREFIX_TOKENS = 55, 64, 32
KS = (0, 5, 15, 25, 50, 100)
RECOMPUTE_KS, RECOMPUTE_RS = (20, 50), (0, 1, 2, 4, 8)


def write_dummy_model(folder: Path, weights: str = "bf16") -> Path:
    """The 8B shape's config-only folder; ``weights="int4"`` makes vLLM's dummy load build
    4-bit layers (:func:`bench.dummy.dummy_weights_config`; bf16 writes the bytes as before)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = dummy_weights_config(LLAMA_31_8B, weights)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 120000) for _ in range(n)]


def _entry(
    key: str,
    ids: list[int],
    fingerprint: str,
    gen: torch.Generator,
    dtype: torch.dtype = torch.bfloat16,  # what the engine's cache holds (fp8: its fp8 format)
) -> FactKV:
    shape = (LLAMA_31_8B["num_hidden_layers"], len(ids), 8, 128)  # [layers, tokens, heads, dim]
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return FactKV(key, ids, k, v, fingerprint)


class Suite:
    def __init__(self, out: Path, pool_size: int = 260, gpu_pool_gib: float = 4.0) -> None:
        self.out = out
        self.rng = random.Random(0)
        # SUITE_WEIGHTS: the dummy weights (bf16 | int4: compressed-tensors W4A16, Marlin)
        self.weights = os.environ.get("SUITE_WEIGHTS", "") or "bf16"
        if self.weights != "bf16" and os.environ.get("SUITE_QUANTIZATION"):
            raise SystemExit("SUITE_WEIGHTS=int4 and SUITE_QUANTIZATION are either-or")
        folder = "/tmp/inferscale-llama8b" + ("" if self.weights == "bf16" else f"-{self.weights}")
        model = write_dummy_model(Path(folder), self.weights)
        # SUITE_KV_CACHE_DTYPE: vLLM's KV cache (auto: bf16 | fp8); an fp8 engine's entries are
        # fp8 values as its cache holds them, in a store of their own (model_fingerprint)
        self.kv_cache_dtype = os.environ.get("SUITE_KV_CACHE_DTYPE", "auto")
        entry_dtype = fp8_format(self.kv_cache_dtype) or torch.bfloat16
        self.fingerprint = model_fingerprint(model, self.kv_cache_dtype)
        store_root = Path("/tmp/inferscale-gpu-kv") / self.fingerprint
        gpu_bytes = int(gpu_pool_gib * (1 << 30))
        # SUITE_STORE_DTYPE: how the pool's entries are stored (model | fp8 | int4; the
        # product's default is int4, earlier suites ran the model's dtype)
        self.store_dtype = os.environ.get("SUITE_STORE_DTYPE", "model")
        self.store = KVStore(
            store_root,
            16 << 30,
            gpu_bytes=gpu_bytes,
            fingerprint=self.fingerprint,
            store_dtype=self.store_dtype,
        )
        gen = torch.Generator().manual_seed(0)
        self.prefix_ids = _ids(self.rng, PREFIX_TOKENS)
        self.prefix_key = entry_key("prefix", self.fingerprint, tuple(self.prefix_ids))
        self.store.put(_entry(self.prefix_key, self.prefix_ids, self.fingerprint, gen, entry_dtype))
        self.pool: list[tuple[str, list[int]]] = []
        t0 = time.perf_counter()
        for i in range(pool_size):
            ids = _ids(self.rng, FACT_TOKENS)
            key = entry_key("fact", self.fingerprint, i, tuple(ids))
            self.store.put(_entry(key, ids, self.fingerprint, gen, entry_dtype))
            self.pool.append((key, ids))
        self.store_fill_s = time.perf_counter() - t0
        extra: dict[str, Any] = {"load_format": "dummy", "skip_tokenizer_init": True}
        self.cudagraph_mode = os.environ.get("SUITE_CUDAGRAPH_MODE", "")  # "" = vLLM's default
        block_size = os.environ.get("SUITE_BLOCK_SIZE", "")  # "" = the product default (64)
        self.block_size = int(block_size) if block_size else None
        if self.cudagraph_mode:
            extra["compilation_config"] = {"cudagraph_mode": self.cudagraph_mode}
        # vLLM hashes every full block of a prompt at intake: "sha256" (vLLM's default, pickle
        # + SHA-256) or e.g. "xxhash" (pickle + xxHash-128), to measure what that costs.
        self.hash_algo = os.environ.get("SUITE_HASH_ALGO", "")  # "" = vLLM's default
        if self.hash_algo:
            extra["prefix_caching_hash_algo"] = self.hash_algo
        # SUITE_QUANTIZATION: how vLLM holds the weights ("" = bf16; "fp8" = quantized on load)
        self.quantization = os.environ.get("SUITE_QUANTIZATION", "")
        if self.quantization:
            extra["quantization"] = self.quantization
        t0 = time.perf_counter()
        self.engine = wiring.start_engine(
            model,
            self.store,
            dtype="bfloat16",
            kv_cache_dtype=self.kv_cache_dtype,
            max_model_len=8192,
            gpu_memory_utilization=0.5,
            extra=extra,
            connector_extra={"host_bytes": 16 << 30},
            block_size=self.block_size,
            # 0: vLLM's own (16,384 on an H200), as every earlier suite ran (the product's 512
            # is for one user's chat beside background encoding: bench/app_path.py)
            max_num_batched_tokens=int(os.environ.get("SUITE_STEP_TOKENS", "0")),
        )
        self.engine_start_s = time.perf_counter() - t0
        # The steady state of the GPU tier: every fact in the pool before anything is timed
        # (else the first requests to draw a fact also pay its copy in; the host tier is timed
        # on its own in load_times).
        report = self.store.prefetch([self.prefix_key] + [key for key, _ in self.pool])
        assert not report.skipped and not report.missing, report

    def request(self, k: int, recompute: int = 0) -> ComposedPrompt:
        """k fresh facts of the pool and a fresh question; the last ``recompute`` facts are
        prefilled with the question, not injected (in a prefix-cache salt of their own)."""
        facts = self.rng.sample(self.pool, k)
        question = _ids(self.rng, QUESTION_TOKENS)
        prefix = (self.prefix_key, self.prefix_ids)
        return layout_request(prefix, facts, question, "gpu-suite", recompute)

    def _ttft(self, prompt: Any) -> tuple[float, Any]:
        result = self.engine.generate(prompt, max_tokens=1)
        return result.ttft_s, result

    def _llm_generate_wall(self, prompt_ids: list[int], kv_params: dict | None) -> float:
        from vllm import SamplingParams

        extra = {"kv_transfer_params": kv_params} if kv_params else None
        params = SamplingParams(max_tokens=1, temperature=0.0, extra_args=extra, skip_clone=True)
        prompt: dict[str, Any] = {"prompt_token_ids": prompt_ids}
        if kv_params:
            prompt["cache_salt"] = "gpu-suite"
        t0 = time.perf_counter()
        self.engine.llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - t0

    def ttft(self, runs: int = 21, warmup: int = 3) -> list[dict]:
        from bench.probes import connector_clock

        for _ in range(warmup):
            for k in (5, 50):
                composed = self.request(k)
                self._ttft(composed)
                self._ttft(composed.prompt_ids)
        # Every k in turn within each repetition: the host's speed drifts over minutes (the
        # same code ran 1.9x slower in one run than in the next on one machine), and ratios
        # between k, or against k=0, must not pick that up.
        modes = ("inject", "prompt", "prompt_warm")
        cells = {k: {m: [] for m in modes} for k in KS}
        walls = {k: {"inject": [], "prompt": []} for k in KS}
        loaded: dict[int, list[int]] = {k: [] for k in KS}
        computed: dict[int, list[int]] = {k: [] for k in KS}
        # The connector's own time per request (us, host side: no device syncs), from outside.
        load_parts: dict[int, list[dict[str, float]]] = {k: [] for k in KS}
        warm = {k: self.request(k).prompt_ids for k in KS}
        for k in KS:
            self._ttft(warm[k])  # prime the prefix cache with the identical prompt
        # Before each timed request, the same small untimed one, so that every timed request
        # follows the same thing: what ran before it otherwise depends on k (the k=0 request
        # right after k=100's 5.6k-token cold prefill was ~2 ms slower than the next ones).
        settle = self.request(0).prompt_ids

        def timed(prompt: Any) -> tuple[float, Any]:
            self._ttft(settle)
            return self._ttft(prompt)

        with connector_clock(self.engine) as clock:
            for _ in range(runs):
                for k in KS:
                    composed = self.request(k)
                    self._ttft(settle)
                    clock.take()
                    ttft, result = self._ttft(composed)
                    if k:
                        load_parts[k].append(clock.take())
                    assert result.refused is None, result.refused
                    cells[k]["inject"].append(ttft)
                    loaded[k].append(result.injected_tokens)
                    computed[k].append(result.computed_tokens)
                    cells[k]["prompt"].append(timed(self.request(k).prompt_ids)[0])
                    cells[k]["prompt_warm"].append(timed(warm[k])[0])
                    walls[k]["inject"].append(
                        self._llm_generate_wall(
                            (c := self.request(k)).prompt_ids,
                            c.kv_transfer_params(self.fingerprint),
                        )
                    )
                    walls[k]["prompt"].append(
                        self._llm_generate_wall(self.request(k).prompt_ids, None)
                    )
        rows = []
        for k in KS:
            parts = load_parts[k]
            for mode, values in cells[k].items():
                rows.append(
                    {
                        "k": k,
                        "mode": mode,
                        "runs": runs,
                        "prompt_tokens": PREFIX_TOKENS + k * FACT_TOKENS + QUESTION_TOKENS,
                        "ttft_s_median": statistics.median(values),
                        "ttft_s_p90": percentile(values, 0.9),
                        "samples": values,
                        "generate_wall_s_median": (
                            statistics.median(walls[k][mode]) if mode in walls[k] else None
                        ),
                        "injected_tokens_median": statistics.median(loaded[k])
                        if mode == "inject"
                        else 0,
                        "computed_tokens_median": (
                            statistics.median(computed[k]) if mode == "inject" else None
                        ),
                        "connector_us_medians": (
                            {part: statistics.median(x[part] for x in parts) for part in parts[0]}
                            if mode == "inject" and parts
                            else None
                        ),
                    }
                )
            print(
                f"k={k}: "
                + ", ".join(f"{r['mode']} {r['ttft_s_median'] * 1e3:.1f} ms" for r in rows[-3:]),
                flush=True,
            )
        return rows

    def recompute(
        self,
        ks: Sequence[int] = RECOMPUTE_KS,
        rs: Sequence[int] = RECOMPUTE_RS,
        runs: int = 21,
        warmup: int = 3,
    ) -> dict[str, Any]:
        """TTFT of the tail-recompute hybrid against plain injection and prompt injection.

        At each k, injection with the last r facts prefilled (r < k; r=0 plain injection) and
        prompt injection, fresh facts and question every request, every cell in turn within
        each repetition and each after the same small untimed request (as :meth:`ttft`).
        """
        cells = recompute_cells(ks, rs)

        def prompt(k: int, r: int | None) -> Any:
            return self.request(k).prompt_ids if r is None else self.request(k, r)

        for _ in range(warmup):  # each r has its own salt: each primes its own prefix block
            for cell in cells:
                self._ttft(prompt(*cell))
        settle = self.request(0).prompt_ids
        samples: dict[tuple[int, int | None], list[tuple[float, int, int]]] = {
            cell: [] for cell in cells
        }
        for _ in range(runs):
            for cell in cells:
                self._ttft(settle)
                ttft, result = self._ttft(prompt(*cell))
                assert result.refused is None, result.refused
                samples[cell].append((ttft, result.computed_tokens, result.injected_tokens))
        summary = summarize_recompute(samples)
        for k in ks:
            line = [
                f"{row['mode'] if row['mode'] == 'prompt' else 'r=' + str(row['recompute'])}"
                f" {row['ttft_s_median'] * 1e3:.1f} ms"
                for row in summary["rows"]
                if row["k"] == k
            ]
            print(f"recompute k={k}: " + ", ".join(line), flush=True)
        return summary

    def compressed(
        self,
        k: int = 50,
        runs: int = 15,
        facts: int = 120,
        schemes: Sequence[str] = ("model", "int4", "fp8"),
    ) -> dict[str, Any]:
        """TTFT at ``k`` with the facts' entries stored as each scheme, from each tier: the GPU
        pool, pinned host RAM, and disk with the files out of the page cache
        (``posix_fadvise(DONTNEED)``: cold). The same random KV is written once per scheme under
        keys of its own; every (scheme, tier) cell in turn within each repetition, each after
        the same small untimed request (as :meth:`ttft`)."""
        pools: dict[str, list[tuple[str, list[int]]]] = {}
        sizes: dict[str, float] = {}
        for scheme in schemes:
            pools[scheme] = []
            for key, ids in self.pool[:facts]:
                entry = self.store.get(key)
                named = f"{key}-{scheme}"
                self.store.put(
                    FactKV(named, ids, entry.k, entry.v, entry.fingerprint, entry.origin),
                    scheme=scheme,
                )
                pools[scheme].append((named, ids))
            sizes[scheme] = statistics.fmean(
                self.store.header(key).nbytes for key, _ in pools[scheme]
            )
        settle = self.request(0).prompt_ids
        prefix = (self.prefix_key, self.prefix_ids)
        tiers = ("device", "host", "disk")
        samples: dict[str, list[float]] = {f"{s}/{t}": [] for s in schemes for t in tiers}
        # Where a cell's time goes, from outside (CPU time, no device sync, so the TTFT is
        # undisturbed): the scheduler side, the worker's whole load, the store's prefetch
        # within it, and the pool's evictions (each copies its entry out to host RAM)
        phases: dict[str, list[dict[str, float]]] = {name: [] for name in samples}
        for _ in range(3):  # warm-up: every scheme's own salt, the dequantize path
            for scheme in schemes:
                facts_ = self.rng.sample(pools[scheme], k)
                question = _ids(self.rng, QUESTION_TOKENS)
                self._ttft(layout_request(prefix, facts_, question, f"gpu-suite-{scheme}"))
        with _load_clock(self.engine, self.store) as clock:
            for _ in range(runs):
                for scheme in schemes:
                    for tier in tiers:
                        facts_ = self.rng.sample(pools[scheme], k)
                        question = _ids(self.rng, QUESTION_TOKENS)
                        composed = layout_request(prefix, facts_, question, f"gpu-suite-{scheme}")
                        keys = [key for key, _ in facts_]
                        if tier == "device":
                            self.store.prefetch(keys)
                        elif tier == "host":
                            self.store.demote(keys, "host", pin=True)
                        else:
                            self.store.demote(keys, "disk")
                            _drop_page_cache([self.store.path(key) for key in keys])
                        self._ttft(settle)
                        clock.take()
                        clock.calls.clear()
                        ttft, result = self._ttft(composed)
                        assert result.refused is None, result.refused
                        samples[f"{scheme}/{tier}"].append(ttft)
                        took = clock.take()
                        took["evictions"] = clock.calls.get("evict_us", 0)
                        phases[f"{scheme}/{tier}"].append(took)
        cells = {
            name: {
                "ttft_s_median": statistics.median(values),
                "ttft_s_p90": percentile(values, 0.9),
                "samples": values,
                "phases_median": {
                    phase: statistics.median(row.get(phase, 0.0) for row in phases[name])
                    for phase in ("scheduler_us", "load_us", "prefetch_us", "evict_us", "evictions")
                },
            }
            for name, values in samples.items()
        }
        for name, cell in cells.items():
            scheme, tier = name.split("/")
            base = cells[f"model/{tier}"]["ttft_s_median"]
            cell["vs_model"] = round(cell["ttft_s_median"] / base, 3)
        print(
            "compressed k=50: "
            + ", ".join(f"{n} {c['ttft_s_median'] * 1e3:.1f} ms" for n, c in cells.items()),
            flush=True,
        )
        for name, cell in cells.items():
            ms = {phase: value / 1e3 for phase, value in cell["phases_median"].items()}
            print(
                f"  {name}: load {ms['load_us']:.2f} ms (prefetch {ms['prefetch_us']:.2f},"
                f" {cell['phases_median']['evictions']:.0f} evictions {ms['evict_us']:.2f}),"
                f" scheduler {ms['scheduler_us']:.2f} ms",
                flush=True,
            )
        return {"k": k, "runs": runs, "bytes_per_entry": sizes, "cells": cells}

    def load_times(self, k: int = 50, runs: int = 10) -> dict[str, Any]:
        """The connector's whole load at k (ms, device-synced around it, timed from outside),
        entries in the GPU pool vs in pinned host RAM."""
        from bench.probes import connector_clock

        out: dict[str, Any] = {}
        with connector_clock(self.engine, sync=True) as clock:
            for tier in ("device", "host"):
                samples = []
                for _ in range(runs):
                    composed = self.request(k)
                    keys = [e.key for e in composed.entries]
                    if tier == "device":
                        self.store.prefetch(keys)
                    else:
                        self.store.demote(keys, "host", pin=True)
                    clock.take()
                    self._ttft(composed)
                    samples.append({"load_ms": clock.take().get("load_us", 0.0) / 1e3})
                out[tier] = samples
        out["pinned_h2d_gb_per_s"] = _pinned_bandwidth()
        return out

    def fused_kernel(self, k: int = 50, iters: int = 50) -> dict[str, Any]:
        """The one-kernel load alone at k (entries in the GPU pool), into scratch caches of the
        engine's layout: the kernel's GPU time (torch.profiler), the CPU time to issue a load
        (table, its copy, the launch), and the bandwidth the kernel reaches (read + written)."""
        from inferscale_core.vllm_plugin.fused_inject import FusedInjector, SourcePiece
        from inferscale_core.vllm_plugin.paged_layouts import PagedLayout

        _, connector = self.engine.connectors()
        worker = connector.worker if connector is not None else None
        if worker is None:
            return {}
        composed = self.request(k)
        keys = [e.key for e in composed.entries]
        self.store.prefetch(keys)
        entries = [self.store.get(key) for key in keys]
        layers, _, heads, dim = entries[0].k.shape
        tokens = sum(e.k.shape[1] for e in entries)
        block_size = worker.block_size
        blocks = tokens // block_size + 1
        caches = [  # FA3's layout on the H200: [blocks, heads, block_size, 2 * dim], NHD in memory
            torch.empty(
                blocks, block_size, heads, 2 * dim, dtype=torch.bfloat16, device="cuda"
            ).permute(0, 2, 1, 3)
            for _ in range(layers)
        ]
        layout = PagedLayout.FUSED_HEADS
        injector = FusedInjector(caches, layout, block_size, heads, dim, worker.spec.shared_rope)
        pieces, at = [], 0
        for entry in entries:
            n = entry.k.shape[1]
            pieces.append(SourcePiece(entry.k, entry.v, 0, n, at))
            at += n
        block_ids = list(range(blocks))
        injector.inject(pieces, 0, tokens, block_ids)  # compile
        torch.cuda.synchronize()
        from inferscale_core.load_plan import Piece

        found = self.store.device_spans(keys)
        assert found is not None, "the entries should all be in the GPU pool"
        pool, spans, entry_layout = found
        plan_pieces = [
            Piece(p_key, 0, p.src_end, p.dst_start) for p_key, p in zip(keys, pieces, strict=True)
        ]

        def in_place() -> None:
            injector.inject_in_place(pool, spans, entry_layout, plan_pieces, 0, tokens, block_ids)

        in_place()
        cpu, cpu_in_place = [], []
        for _ in range(iters):  # the CPU's part: table, copy and launch (GPU idle meanwhile)
            t0 = time.perf_counter()
            injector.inject(pieces, 0, tokens, block_ids)
            cpu.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            in_place()
            cpu_in_place.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                injector.inject(pieces, 0, tokens, block_ids)
            torch.cuda.synchronize()
        kernel = [e for e in prof.key_averages() if "inject_kernel" in e.key]
        gpu_ms = kernel[0].device_time_total / kernel[0].count / 1e3 if kernel else float("nan")
        moved = 2 * 2 * tokens * layers * heads * dim * entries[0].k.element_size()  # K+V, r+w
        return {
            "k": k,
            "tokens": tokens,
            "iters": iters,
            "gpu_ms_per_load": gpu_ms,
            "cpu_issue_ms": statistics.median(cpu) * 1e3,  # entries as tensors
            "cpu_issue_in_place_ms": statistics.median(cpu_in_place) * 1e3,  # as pool offsets
            "bytes_moved": moved,
            "gb_per_s": moved / (gpu_ms / 1e3) / 1e9,
        }

    def profile(self, k: int = 50, runs: int = 5) -> str:
        """Where a k-fact injection request spends its time: torch.profiler + cProfile."""
        import cProfile
        import io
        import pstats

        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        requests = [self.request(k) for _ in range(runs)]
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for composed in requests:
                self._ttft(composed)
        text = prof.key_averages().table(sort_by="cpu_time_total", row_limit=45)
        text += "\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(runs):
            self._ttft(self.request(k))
        profiler.disable()
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(60)
        return text + "\n" + stream.getvalue()

    def throughput(
        self, users: int = 100, k: int = 50, max_tokens: int = 32, waves: int = 1
    ) -> dict[str, Any]:
        """``waves`` waves of ``users`` requests at once per mode, the modes alternating (a
        drift of the machine hits both); each mode's median wave by requests per second is
        reported, with every wave's rate and first step."""
        done: dict[str, list[dict[str, Any]]] = {"inject": [], "prompt": []}
        for wave in range(waves):
            for mode in done:
                done[mode].append(self._wave(mode, users, k, max_tokens, wave))
        out = {}
        for mode, runs in done.items():
            ranked = sorted(runs, key=lambda r: r["requests_per_s"])
            out[mode] = {
                **ranked[len(ranked) // 2],
                "waves": len(runs),
                "waves_requests_per_s": [round(r["requests_per_s"], 2) for r in runs],
                "waves_first_step_ms": [r["step_ms_first"][0] for r in runs],
            }
        return out

    def _wave(self, mode: str, users: int, k: int, max_tokens: int, wave: int) -> dict[str, Any]:
        from vllm import SamplingParams

        requests = [self.request(k) for _ in range(users)]
        engine = self.engine._engine
        first: dict[str, float] = {}
        t0 = time.perf_counter()
        for i, composed in enumerate(requests):
            extra = None
            prompt: dict[str, Any] = {"prompt_token_ids": composed.prompt_ids}
            if mode == "inject":
                extra = {"kv_transfer_params": composed.kv_transfer_params(self.fingerprint)}
                prompt["cache_salt"] = "gpu-suite"
            params = SamplingParams(
                max_tokens=max_tokens,
                min_tokens=max_tokens,
                temperature=0.0,
                extra_args=extra,
                ignore_eos=True,
                skip_clone=True,  # as the product's engine does
            )
            engine.add_request(f"tput-{mode}-{wave}-{i}", prompt, params)
        added = time.perf_counter() - t0
        done = 0
        steps: list[tuple[float, int]] = []  # (ms, requests with their first token)
        while engine.has_unfinished_requests():
            s0, firsts = time.perf_counter(), 0
            for output in engine.step():
                now = time.perf_counter() - t0
                if output.outputs and output.outputs[0].token_ids:
                    firsts += int(output.request_id not in first)
                    first.setdefault(output.request_id, now)
                done += int(output.finished)
            steps.append((1e3 * (time.perf_counter() - s0), firsts))
        wall = time.perf_counter() - t0
        ttfts = sorted(first.values())
        result = {
            "users": users,
            "k": k,
            "max_tokens": max_tokens,
            "wall_s": wall,
            "requests_per_s": users / wall,
            "ttft_s_p50": statistics.median(ttfts),
            "ttft_s_p90": percentile(ttfts, 0.9),
            "finished": done,
            # Where the wave's time goes: adding the requests, then each engine step
            # (the first ones schedule, load and prefill; the rest decode).
            "add_requests_s": added,
            "steps": len(steps),
            "step_ms_first": [round(ms, 1) for ms, _ in steps[:6]],
            "first_tokens_by_step": [n for _, n in steps[:6]],
            "step_ms_median": statistics.median(ms for ms, _ in steps) if steps else None,
        }
        print(
            f"throughput {mode} wave {wave + 1}: {users / wall:.1f} req/s; add {added:.3f} s,"
            f" {len(steps)} steps, first {result['step_ms_first']} ms"
            f" ({result['first_tokens_by_step']} first tokens),"
            f" median {result['step_ms_median']:.1f} ms",
            flush=True,
        )
        return result


@contextlib.contextmanager
def _load_clock(engine: Any, store: KVStore) -> Iterator[MethodClock]:
    """:func:`~bench.probes.connector_clock` (no sync) plus the store's ``prefetch``
    (``prefetch_us``) and the pool's evictions (``evict_us``: the store's ``_demote``, called
    for each victim; its calls count them)."""
    from bench.probes import connector_clock

    with connector_clock(engine) as clock:
        _, worker = engine.connectors()
        stores = {id(store): store}
        if worker is not None and worker.worker is not None:
            stores[id(worker.worker.store)] = worker.worker.store
        for each in stores.values():
            clock.wrap(each, "prefetch", "prefetch_us")
            clock.wrap(each, "_demote", "evict_us")
        yield clock


def _drop_page_cache(paths: Sequence[Path]) -> None:
    """Evict the files' pages from the page cache (their next read comes from the disk)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _pinned_bandwidth(nbytes: int = 360 << 20, runs: int = 5) -> float:
    """Measured pinned host -> device copy bandwidth (GB/s): the floor of the host tier."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(runs):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes * runs / (time.perf_counter() - t0) / 1e9


def recompute_cells(ks: Sequence[int], rs: Sequence[int]) -> list[tuple[int, int | None]]:
    """``(k, r)`` in the order :meth:`Suite.recompute` times them: per k, r ascending (r < k:
    r = k is prompt injection), then ``(k, None)``, prompt injection."""
    cells: list[tuple[int, int | None]] = []
    for k in sorted(set(ks)):
        cells += [(k, r) for r in sorted(set(rs)) if r < k]
        cells.append((k, None))
    return cells


def summarize_recompute(
    samples: Mapping[tuple[int, int | None], Sequence[tuple[float, int, int]]],
) -> dict[str, Any]:
    """Rows (median, p90 TTFT; median computed and injected tokens) and ratios of the
    ``recompute`` part from ``(ttft_s, computed_tokens, injected_tokens)`` per request."""
    rows = []
    for (k, r), values in samples.items():
        ttfts = [ttft for ttft, _, _ in values]
        rows.append(
            {
                "k": k,
                "mode": "prompt" if r is None else "inject",
                "recompute": k if r is None else r,  # facts prefilled as text
                "runs": len(values),
                "prompt_tokens": PREFIX_TOKENS + k * FACT_TOKENS + QUESTION_TOKENS,
                "ttft_s_median": statistics.median(ttfts),
                "ttft_s_p90": percentile(ttfts, 0.9),
                "samples": ttfts,
                "computed_tokens_median": statistics.median(c for _, c, _ in values),
                "injected_tokens_median": statistics.median(i for _, _, i in values),
            }
        )
    by = {(row["k"], row["mode"], row["recompute"]): row["ttft_s_median"] for row in rows}
    ratios = {}
    for (k, mode, r), value in by.items():
        if mode != "inject":
            continue
        if r and (k, "inject", 0) in by:
            ratios[f"inject_r{r}_over_r0_k{k}"] = value / by[(k, "inject", 0)]
        if (k, "prompt", k) in by:
            ratios[f"prompt_over_inject_r{r}_k{k}"] = by[(k, "prompt", k)] / value
    ks = sorted({row["k"] for row in rows})
    rs = sorted({row["recompute"] for row in rows if row["mode"] == "inject"})
    return {
        "ks": ks,
        "rs": rs,
        "fact_tokens": FACT_TOKENS,
        "question_tokens": QUESTION_TOKENS,
        "rows": rows,
        "ratios": ratios,
    }


PARTS = (
    "ttft", "load", "kernel", "unfused", "profile", "throughput", "recompute", "anatomy",
    "compressed",
)  # fmt: skip
DEFAULT_PARTS = ("ttft", "load", "kernel", "unfused", "profile", "throughput")


def chosen_parts(environ: Mapping[str, str]) -> set[str]:
    """``SUITE_PARTS`` (comma-separated, default :data:`DEFAULT_PARTS`: all but ``recompute``
    and ``anatomy``) picks what runs; ``SUITE_UNFUSED=0`` / ``SUITE_PROFILE=0`` drop
    ``unfused`` / ``profile`` as before."""
    chosen = set(parse_names(environ.get("SUITE_PARTS", ",".join(DEFAULT_PARTS))))
    unknown = chosen - set(PARTS)
    if unknown:
        raise SystemExit(f"SUITE_PARTS: unknown {sorted(unknown)}; known: {', '.join(PARTS)}")
    if environ.get("SUITE_UNFUSED", "1") != "1":
        chosen.discard("unfused")
    if environ.get("SUITE_PROFILE", "1") != "1":
        chosen.discard("profile")
    return chosen


def recompute_grid(environ: Mapping[str, str]) -> dict[str, list[int]]:
    """``SUITE_RECOMPUTE_KS`` / ``SUITE_RECOMPUTE_RS`` (comma-separated) as
    :meth:`Suite.recompute`'s ``ks`` / ``rs``; unset: its defaults."""
    grid = {}
    for name in ("ks", "rs"):
        text = environ.get(f"SUITE_RECOMPUTE_{name.upper()}", "")
        if text.strip():
            try:
                grid[name] = parse_ks(text, f"SUITE_RECOMPUTE_{name.upper()}")
            except ValueError as exc:
                raise SystemExit(str(exc)) from None
    return grid


def main(out: Path) -> None:
    """Run the parts :func:`chosen_parts` picks from the environment; write
    ``gpu_suite.json``."""
    parts = chosen_parts(os.environ)
    grid = recompute_grid(os.environ)  # before the engine starts: a typo fails at once
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"bench": "gpu_suite", "device": torch.cuda.get_device_name()}
    suite = Suite(out)
    result.update(store_fill_s=suite.store_fill_s, engine_start_s=suite.engine_start_s)
    result["cudagraph_mode"] = suite.cudagraph_mode or "default (FULL_AND_PIECEWISE)"
    result["store_dtype"] = suite.store_dtype
    result["kv_cache_dtype"] = suite.kv_cache_dtype
    result["quantization"] = suite.quantization or "none"
    result["weights"] = suite.weights
    result["block_size"] = suite.engine.block_size
    result["prefix_caching_hash_algo"] = suite.hash_algo or "default (sha256)"
    # vLLM 0.26 picks its V2 model runner for this model unless VLLM_USE_V2_MODEL_RUNNER=0.
    v2 = getattr(suite.engine.llm.llm_engine.vllm_config, "use_v2_model_runner", False)
    result["model_runner"] = "v2" if v2 else "v1"
    print(f"model runner {result['model_runner']}", flush=True)
    print(f"engine up in {suite.engine_start_s:.1f} s", flush=True)

    def save() -> None:
        (out / "gpu_suite.json").write_text(json.dumps(result, indent=1))

    if "anatomy" in parts:
        from bench.diagnose import step_anatomy

        result["anatomy"] = step_anatomy.run(suite, out)
        save()
    if "ttft" in parts:
        result["ttft"] = suite.ttft()
        save()
    if "load" in parts:
        result["load_times"] = suite.load_times()
    if "kernel" in parts:
        result["fused_kernel"] = suite.fused_kernel()
        print("fused kernel:", result["fused_kernel"], flush=True)
    _, connector = suite.engine.connectors()
    worker = connector.worker if connector is not None else None
    if worker is not None and "unfused" in parts:
        # The same through the backend path (rotation per piece, per-layer backend writes).
        result["kv_write"] = worker.kv_write
        result["used_fused_kernel"] = worker.writes_with_fused_kernel
        worker.kv_write = "backend"
        result["load_times_unfused"] = suite.load_times(runs=5)
        worker.kv_write = result["kv_write"]
    if "profile" in parts:
        (out / "profile.txt").write_text(suite.profile())
    save()
    if "throughput" in parts:
        result["throughput"] = suite.throughput(waves=int(os.environ.get("SUITE_WAVES", "3")))
    if "recompute" in parts:
        result["recompute"] = suite.recompute(**grid)
    if "compressed" in parts:
        result["compressed"] = suite.compressed()
        save()
    result["store_stats"] = repr(suite.store.stats())
    save()
    print("wrote", out / "gpu_suite.json", flush=True)


def plot_runs(paths: list[Path], out: Path) -> None:
    """TTFT vs k (injection, prompt injection, warm prompt) of saved suite runs, one colour per
    mode and one line style per run: ``python -m bench.gpu_suite --plot OUT
    RUN.json...``."""
    from bench.report import figure, save_figure

    fig, ax = figure(7.5, 4.4)
    styles = ["-", "--", ":", "-."]
    labels = {"inject": "KV injection", "prompt": "prompt injection", "prompt_warm": "warm prompt"}
    for i, path in enumerate(paths):
        rows = json.loads(Path(path).read_text())["ttft"]
        for j, (mode, label) in enumerate(labels.items()):
            points = sorted((r["k"], r["ttft_s_median"] * 1e3) for r in rows if r["mode"] == mode)
            ax.plot(
                [k for k, _ in points],
                [ms for _, ms in points],
                styles[i % len(styles)],
                color=f"C{j}",
                marker="o",
                markersize=3,
                label=f"{label} ({Path(path).stem})",
            )
    ax.set_xlabel("k retrieved facts (55 tokens each)")
    ax.set_ylabel("TTFT, median (ms)")
    ax.set_yscale("log")
    ax.set_title("H200, vLLM 0.26, Llama-3.1-8B shape (dummy weights), bf16")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    save_figure(fig, out)


if __name__ == "__main__":
    if sys.argv[1] == "--plot":
        plot_runs([Path(p) for p in sys.argv[3:]], Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
