"""In-process vLLM engine with the InferScale connector, reporting TTFT and what was injected."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_core.engine import CHAT_PRIORITY
from inferscale_core.vllm_plugin.driver import EngineDriver
from inferscale_core.vllm_plugin.engine_requests import QueuedRequests

if TYPE_CHECKING:
    from inferscale_core.kvstore import KVStore
    from inferscale_core.vllm_plugin.worker_side import LoadStats

CONNECTOR_MODULE = "inferscale_core.vllm_plugin.connector"
CONNECTOR_CLASS = "InferScaleConnector"
GPU_BLOCK_SIZE = 64  # tokens per KV-cache block on a GPU (see EngineOptions.block_size)
CPU_STEP_TOKENS = 64  # prompt tokens per engine step on a CPU (see EngineOptions)
GPU_STEP_TOKENS = 512  # on a GPU: within the CUDA-graph sizes (vLLM's LLM default: 16,384)


@dataclass(slots=True)
class EngineOptions:
    """How to build the engine. On a CPU: fp32 (bf16 is ~10x slower on AVX2) and eager
    (the engine starts in ~26 s instead of ~245 s with compilation)."""

    model_dir: Path
    store_path: Path
    fingerprint: str
    dtype: str = "auto"  # "auto": float32 on CPU, the model's dtype on a GPU
    # vLLM's KV cache: "auto" in the model's dtype, "fp8" in fp8 e4m3 (half of bf16; on a CPU
    # only with AVX-512 or AMX). Entries are kept as that cache holds them (fp8_cache.py).
    kv_cache_dtype: str = "auto"
    # vLLM's weight quantization on load ("fp8" for weights = fp8; weights_plan.py decides),
    # None: the weights as the model folder stores them (its quantization_config, if any).
    quantization: str | None = None
    max_model_len: int = 8192
    kv_cache_gib: float = 2.0  # CPU KV cache (VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float = 0.5
    enable_prefix_caching: bool = True
    enforce_eager: bool | None = None  # None: eager on CPU, compiled + CUDA graphs on GPU
    seed: int = 0
    kv_write: str = "auto"  # see worker_side: "fused" on a GPU where it applies, else "backend"
    # Tokens per KV-cache block; None: 64 on a GPU, vLLM's default on CPU. vLLM's scheduler
    # does Python work per block (hashing, allocation, prefix-cache bookkeeping): with 64 instead
    # of 16, injection at k=50 on the H200 went from 3.8-4.3x to 6.1-6.3x prompt injection's
    # speed, on one machine. 256 measured the same as 64 on one machine and caches prompts
    # more coarsely (docs/DESIGN.md, "On the GPU").
    block_size: int | None = None
    # Prompt tokens one engine step may compute (vLLM's chunked prefill): a chat turn arriving
    # while encoding requests run waits for at most the step in flight. None: the product's,
    # 64 on a CPU (with another user's backlog encoding, chat TTFT p90 was 2.3x idle at 128,
    # 1.85x at 64, for 29% fewer facts encoded per second: bench app) and 512 on a GPU (an 8B
    # step of 512 tokens takes ~15 ms on an H200; vLLM's 16,384 would hold a turn ~0.5 s).
    # 0: vLLM's own (larger steps: throughput when serving many users; the latency benches'
    # default, as every run before these settings).
    max_num_batched_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more LLM(...) keyword arguments
    # more connector settings (kv_connector_extra_config), e.g. the store's gpu_bytes/host_bytes
    connector_extra: dict[str, Any] = field(default_factory=dict)


def prepare_environment(options: EngineOptions, multiprocessing: bool = False) -> bool:
    """Process-wide settings vLLM reads at import time: in-process (one Python process) or
    vLLM's multi-process engine (``multiprocessing``), no telemetry, no network. Returns True
    on a CUDA machine."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
    for name in (
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "DO_NOT_TRACK",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
    ):
        os.environ[name] = "1"
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(options.kv_cache_gib)))
    return on_gpu


def engine_arguments(options: EngineOptions, on_gpu: bool) -> dict[str, Any]:
    """vLLM's engine arguments (``LLM(...)`` / ``AsyncEngineArgs(...)``) for ``options``, with
    the connector over the store and the product's scheduling."""
    from vllm.config import KVTransferConfig

    dtype = options.dtype if options.dtype != "auto" or on_gpu else "float32"
    if options.kv_cache_dtype != "auto":
        check_kv_cache_dtype(options.kv_cache_dtype, on_gpu)
    eager = options.enforce_eager if options.enforce_eager is not None else not on_gpu
    kwargs: dict[str, Any] = dict(
        model=str(options.model_dir),
        dtype=dtype,
        max_model_len=options.max_model_len,
        enforce_eager=eager,
        enable_prefix_caching=options.enable_prefix_caching,
        seed=options.seed,
        # Chat turns before waiting encoding requests (CHAT_PRIORITY, ENCODE_PRIORITY).
        scheduling_policy="priority",
        kv_transfer_config=KVTransferConfig(
            kv_connector=CONNECTOR_CLASS,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role="kv_both",
            kv_connector_extra_config={
                "store_path": str(options.store_path),
                "fingerprint": options.fingerprint,
                "kv_write": options.kv_write,
                **options.connector_extra,
            },
        ),
    )
    if options.kv_cache_dtype != "auto":
        kwargs["kv_cache_dtype"] = options.kv_cache_dtype
    if options.quantization is not None:
        kwargs["quantization"] = options.quantization
    if on_gpu:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
    block_size = options.block_size or (GPU_BLOCK_SIZE if on_gpu else None)
    if block_size is not None:
        kwargs["block_size"] = block_size
    step_tokens = options.max_num_batched_tokens
    if step_tokens is None:
        step_tokens = GPU_STEP_TOKENS if on_gpu else CPU_STEP_TOKENS
    if step_tokens:
        kwargs["max_num_batched_tokens"] = step_tokens
        if on_gpu:  # vLLM wants a token per sequence a step may hold (its H200 default: 1,024)
            kwargs["max_num_seqs"] = min(step_tokens, 1024)
    kwargs.update(options.extra)
    return kwargs


class KVCacheDtypeError(RuntimeError):
    """A ``kv_cache_dtype`` this machine's vLLM cannot run."""


def check_kv_cache_dtype(kv_cache_dtype: str, on_gpu: bool) -> None:
    """Refuse, before vLLM starts, a cache dtype it would refuse deep in its start."""
    from inferscale_core.cpu_features import fp8_kv_cache

    if kv_cache_dtype != "fp8":
        raise KVCacheDtypeError(f"kv_cache_dtype must be auto or fp8, got {kv_cache_dtype!r}")
    if not on_gpu and not fp8_kv_cache():
        raise KVCacheDtypeError(
            "kv_cache_dtype = fp8 needs a GPU, or a CPU with AVX-512 or AMX (vLLM's CPU"
            " attention has no fp8 cache on AVX2); set kv_cache_dtype = auto"
        )


class VllmEngine(QueuedRequests):
    """One ``vllm.LLM`` in this process; requests are composed token ids with a load plan."""

    def __init__(self, options: EngineOptions) -> None:
        on_gpu = prepare_environment(options)
        from vllm import LLM

        self.options = options
        self.fingerprint = options.fingerprint
        kwargs = engine_arguments(options, on_gpu)
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.startup_s = time.perf_counter() - t0
        self._engine = self.llm.llm_engine
        self._driver = EngineDriver(self._engine)  # the one thread that steps it
        self._ids = itertools.count()

    @property
    def step_tokens(self) -> int:
        """Prompt tokens one engine step may compute (vLLM's max_num_batched_tokens)."""
        return self._engine.vllm_config.scheduler_config.max_num_batched_tokens

    @property
    def background_preempted(self) -> int:
        """Background (encoding) requests aborted so far to let a chat prompt go first; each
        was added again after it (driver.py)."""
        return self._driver.preempted

    @property
    def tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def astream(self, prompt: Any, **kwargs: Any) -> Any:
        """Not here: this engine has no event loop of its own (:meth:`stream` on a thread)."""
        raise NotImplementedError("the in-process engine streams on a thread: use stream()")

    def connectors(self) -> tuple[Any, Any]:
        """``(scheduler side, worker side)`` of the connector, both in this process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the two :class:`InferScaleConnector` vLLM made."""
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        core = getattr(self._engine.engine_core, "engine_core", None)  # in-process EngineCore
        if core is None:
            raise RuntimeError("the connector lives in other processes: vLLM is not in-process")
        scheduler = core.scheduler.get_kv_connector()
        worker = get_kv_transfer_group() if has_kv_transfer_group() else None
        return scheduler, worker

    def share_store(self, store: KVStore) -> None:
        """Let the connector serve from ``store``, the app's own in this process: a fact the
        app just encoded is then injected from host RAM or the GPU pool, not read from disk."""
        for side in self.connectors():
            if side is not None:
                side.use_store(store)

    @property
    def load_stats(self) -> LoadStats | None:
        """The worker side's counts of loads (how many, fused, read in place), in-process."""
        _, worker = self.connectors()
        return worker.worker.stats if worker is not None and worker.worker else None

    @property
    def max_model_len(self) -> int:
        """The model's context in tokens: prompt and reply together."""
        return int(self._engine.vllm_config.model_config.max_model_len)

    @property
    def block_size(self) -> int:
        """Tokens per KV-cache block (prefix caching shares whole blocks only)."""
        return int(self._engine.vllm_config.cache_config.block_size)

    def _enqueue(
        self, request_id: str, tokens_prompt: dict[str, Any], params: Any, priority: int
    ) -> Any:
        background = priority > CHAT_PRIORITY  # steps aside for chat prompts (driver.py)
        return self._driver.submit(request_id, tokens_prompt, params, priority, background)

    def abort(self, request_ids: Sequence[str]) -> None:
        self._driver.abort(list(request_ids))

    def wait_for_chat(self, timeout: float | None = None) -> bool:
        """Return once no chat prompt waits for its first token (True), or after ``timeout``
        (False). Background threads call it between units of work: on a CPU a busy Python
        thread slows the engine's steps through the GIL (a 0.1 s turn took 3.9 s beside one)."""
        return self._driver.foreground_idle.wait(timeout)

    def on_engine_thread(self, fn: Any) -> Any:
        """Run ``fn()`` on the thread that steps the engine, between steps (diagnostics)."""
        return self._driver.call(fn)

    def close(self) -> None:
        """Stop the driver thread (the engine itself goes with the process)."""
        self._driver.close()
