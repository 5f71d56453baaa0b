"""In-process vLLM engine with the InferScale connector, reporting TTFT and what was injected."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_core.composer import KV_PARAMS_KEY, ComposedPrompt
from inferscale_core.engine import CHAT_PRIORITY
from inferscale_core.request_signing import sign
from inferscale_core.types import GenerationResult
from inferscale_core.vllm_plugin.driver import DONE, EngineDriver, RequestFailed

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
    # speed, on one machine (runs G-J). 256 measured the same as 64 on one machine (runs P, Q)
    # and caches prompts more coarsely (docs/DESIGN.md, "On the GPU").
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


def sampling_params(
    kv_params: dict[str, Any] | None,
    max_tokens: int,
    temperature: float,
    logprobs: int | None,
    stop: Sequence[str] | None,
    prompt_logprobs: int | None,
    ignore_eos: bool = False,
    json_schema: dict[str, Any] | None = None,
    top_p: float = 1.0,
    top_k: int = 0,
    repetition_penalty: float = 1.0,
) -> Any:
    """vLLM's ``SamplingParams`` of one request: DELTA outputs, the load plan in
    ``extra_args["kv_transfer_params"]`` (the connector reads it there)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    extra = {"kv_transfer_params": kv_params} if kv_params else None
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        repetition_penalty=repetition_penalty,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        stop=list(stop) if stop else None,
        ignore_eos=ignore_eos,
        output_kind=RequestOutputKind.DELTA,
        extra_args=extra,
        structured_outputs=StructuredOutputsParams(json=json_schema) if json_schema else None,
        # Made for this one request: vLLM may use it as is instead of deep-copying it (a
        # copy of the ~50-entry load list per request).
        skip_clone=True,
    )


def request_inputs(
    prompt: ComposedPrompt | Sequence[int],
    inject: bool,
    cache_salt: str | None,
    fingerprint: str,
    request_key: bytes | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(tokens prompt, kv_transfer_params)`` of a request: a composed memory request names
    its entries (when ``inject``) and its cache salt; plain ids are a prompt of their own.
    With ``request_key`` the params are signed for the salt (``request_signing``)."""
    composed = prompt if isinstance(prompt, ComposedPrompt) else None
    prompt_ids = list(composed.prompt_ids) if composed else list(prompt)  # type: ignore[arg-type]
    kv_params = composed.kv_transfer_params(fingerprint) if composed and inject else None
    salt = cache_salt if cache_salt is not None else (composed.cache_salt if composed else None)
    if kv_params is not None and request_key is not None:
        sign(kv_params[KV_PARAMS_KEY], request_key, salt or None)
    tokens_prompt: dict[str, Any] = {"prompt_token_ids": prompt_ids}
    if salt:
        tokens_prompt["cache_salt"] = salt
    return tokens_prompt, kv_params


class VllmEngine:
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
        # In-process the app is the engine's only client: its params go unsigned (a key
        # here must be the connector's request_key, request_signing.py).
        self.request_key: bytes | None = None
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

    def _submit(
        self,
        prompt: ComposedPrompt | Sequence[int],
        inject: bool = True,
        cache_salt: str | None = None,
        priority: int = CHAT_PRIORITY,
        **sampling: Any,
    ) -> tuple[str, Any, GenerationResult, float]:
        """Hand one request to the driver: ``(id, its output queue, empty result, t0)``."""
        tokens_prompt, kv_params = request_inputs(
            prompt, inject, cache_salt, self.fingerprint, self.request_key
        )
        params = sampling_params(kv_params, **sampling)
        request_id = f"inferscale-{next(self._ids)}"
        result = GenerationResult(request_id, len(tokens_prompt["prompt_token_ids"]))
        t0 = time.perf_counter()
        background = priority > CHAT_PRIORITY  # steps aside for chat prompts (driver.py)
        return (
            request_id,
            self._driver.submit(request_id, tokens_prompt, params, priority, background),
            result,
            t0,
        )

    def stream(
        self,
        prompt: ComposedPrompt | Sequence[int],
        *,
        inject: bool = True,
        max_tokens: int = 256,
        temperature: float = 0.0,
        logprobs: int | None = None,
        stop: Sequence[str] | None = None,
        cache_salt: str | None = None,
        prompt_logprobs: int | None = None,
        ignore_eos: bool = False,
        priority: int = CHAT_PRIORITY,
        json_schema: dict[str, Any] | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
    ) -> Iterator[tuple[str, GenerationResult]]:
        """Yield ``(text delta, running result)`` as tokens arrive; the last result is final.

        ``prompt`` is a composed memory request (its KV is injected when ``inject``) or plain
        token ids (prompt injection / no memory). TTFT is measured from submission to the
        step that produced the first token. Other requests (the memory worker's encodes) share
        the engine's steps; ``priority`` (lower first) decides who waits. ``temperature``,
        ``top_p``, ``top_k`` and ``repetition_penalty`` are vLLM's sampling
        (:class:`~inferscale_core.generation.Sampling`).
        """
        request_id, outputs, result, t0 = self._submit(
            prompt,
            inject,
            cache_salt,
            priority,
            max_tokens=max_tokens,
            temperature=temperature,
            logprobs=logprobs,
            stop=stop,
            prompt_logprobs=prompt_logprobs,
            ignore_eos=ignore_eos,
            json_schema=json_schema,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=repetition_penalty,
        )
        finished = False
        try:
            while (item := outputs.get()) is not DONE:
                if isinstance(item, RequestFailed):
                    raise item
                at, output = item
                delta = absorb(result, output, t0, at)
                finished = output.finished
                if delta or finished:
                    yield delta, result
        finally:
            if not finished:  # cancelled (GeneratorExit) or failed: free its blocks
                self._driver.abort([request_id])

    def generate_batch(
        self,
        prompts: Sequence[ComposedPrompt | Sequence[int]],
        *,
        inject: bool = True,
        max_tokens: int = 256,
        temperature: float = 0.0,
        logprobs: int | None = None,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        priority: int = CHAT_PRIORITY,
    ) -> list[GenerationResult]:
        """Submit every prompt at once and wait until all finish (concurrent users, or a wave
        of encoding requests).

        The engine schedules them together, as a server would; each result's ``ttft_s`` and
        ``total_s`` count from the moment the whole batch was submitted. Results come back in
        the order of ``prompts``.
        """
        submitted = [
            self._submit(
                prompt,
                inject,
                cache_salt,
                priority,
                max_tokens=max_tokens,
                temperature=temperature,
                logprobs=logprobs,
                stop=None,
                prompt_logprobs=None,
                ignore_eos=ignore_eos,
            )
            for prompt in prompts
        ]
        t0 = submitted[0][3] if submitted else 0.0
        pending = [request_id for request_id, *_ in submitted]
        try:
            for request_id, outputs, result, _ in submitted:
                while (item := outputs.get()) is not DONE:
                    if isinstance(item, RequestFailed):
                        raise item
                    at, output = item
                    absorb(result, output, t0, at)
                pending.remove(request_id)
        finally:
            if pending:
                self._driver.abort(pending)
        return [result for _, _, result, _ in submitted]

    def generate_json(
        self, prompt_ids: Sequence[int], schema: dict[str, Any], max_tokens: int = 256
    ) -> str:
        """Greedy generation constrained to a JSON schema (vLLM structured outputs)."""
        final = None
        for _, final in self.stream(  # noqa: B007 - the last one is final
            list(prompt_ids), max_tokens=max_tokens, json_schema=schema
        ):
            pass
        assert final is not None
        return final.text

    def warm_up(self) -> float:
        """Run one short request so the first real one does not pay one-time set-up costs."""
        t0 = time.perf_counter()
        self.generate([1, 2, 3, 4], max_tokens=2)
        return time.perf_counter() - t0

    def generate(self, prompt: ComposedPrompt | Sequence[int], **kwargs: Any) -> GenerationResult:
        """Run a request to completion (see :meth:`stream` for the arguments)."""
        final = None
        for _, final in self.stream(prompt, **kwargs):  # noqa: B007 - the last one is final
            pass
        assert final is not None
        return final

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


def absorb(result: GenerationResult, output: Any, t0: float, now: float) -> str:
    """Fold one DELTA RequestOutput (from the step that ended at ``now``) into ``result``;
    return its new text."""
    completion = output.outputs[0]
    if completion.token_ids and result.ttft_s is None:
        result.ttft_s = now - t0
    result.token_ids.extend(completion.token_ids)
    result.text += completion.text
    if completion.logprobs:
        for step in completion.logprobs:
            result.logprobs.append({tok: lp.logprob for tok, lp in step.items()})
    if output.num_cached_tokens is not None:
        result.cached_tokens = output.num_cached_tokens
    if output.finished:
        result.total_s = now - t0
        result.finish_reason = completion.finish_reason
        report = (output.kv_transfer_params or {}).get("inferscale_report")
        if report:
            result.injected_tokens = int(report.get("loaded_tokens") or 0)
            result.prefix_cached_tokens = int(report.get("computed_before") or 0)
            result.injected_entries = list(report.get("entries") or [])
            result.refused = report.get("refused")
            result.entry_tiers = dict(report.get("tiers") or {})
            result.captured = list(report.get("captured") or [])
    return completion.text
