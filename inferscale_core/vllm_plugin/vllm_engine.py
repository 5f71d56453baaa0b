"""In-process vLLM engine with the InferScale connector, reporting TTFT and what was injected."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_core.composer import ComposedPrompt
from inferscale_core.types import GenerationResult

if TYPE_CHECKING:
    from inferscale_core.kvstore import KVStore
    from inferscale_core.vllm_plugin.worker_side import LoadStats

CONNECTOR_MODULE = "inferscale_core.vllm_plugin.connector"
CONNECTOR_CLASS = "InferScaleConnector"
GPU_BLOCK_SIZE = 64  # tokens per KV-cache block on a GPU (see EngineOptions.block_size)


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
    extra: dict[str, Any] = field(default_factory=dict)  # more LLM(...) keyword arguments
    # more connector settings (kv_connector_extra_config), e.g. the store's gpu_bytes/host_bytes
    connector_extra: dict[str, Any] = field(default_factory=dict)


def _prepare_environment(options: EngineOptions) -> bool:
    """Process-wide settings vLLM reads at import time. Returns True on a CUDA machine."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: one Python process
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


class VllmEngine:
    """One ``vllm.LLM`` in this process; requests are composed token ids with a load plan."""

    def __init__(self, options: EngineOptions) -> None:
        on_gpu = _prepare_environment(options)
        from vllm import LLM
        from vllm.config import KVTransferConfig

        self.options = options
        self.fingerprint = options.fingerprint
        dtype = options.dtype if options.dtype != "auto" or on_gpu else "float32"
        eager = options.enforce_eager if options.enforce_eager is not None else not on_gpu
        kwargs: dict[str, Any] = dict(
            model=str(options.model_dir),
            dtype=dtype,
            max_model_len=options.max_model_len,
            enforce_eager=eager,
            enable_prefix_caching=options.enable_prefix_caching,
            seed=options.seed,
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
        kwargs.update(options.extra)
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.startup_s = time.perf_counter() - t0
        self._engine = self.llm.llm_engine
        self._lock = threading.Lock()
        self._ids = itertools.count()

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
    def block_size(self) -> int:
        """Tokens per KV-cache block (prefix caching shares whole blocks only)."""
        return int(self._engine.vllm_config.cache_config.block_size)

    def _sampling_params(
        self,
        kv_params: dict[str, Any] | None,
        max_tokens: int,
        temperature: float,
        logprobs: int | None,
        stop: Sequence[str] | None,
        prompt_logprobs: int | None,
        ignore_eos: bool = False,
    ) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        extra = {"kv_transfer_params": kv_params} if kv_params else None
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            stop=list(stop) if stop else None,
            ignore_eos=ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra,
            # Made for this one request: vLLM may use it as is instead of deep-copying it (a
            # copy of the ~50-entry load list per request).
            skip_clone=True,
        )

    def _request(
        self,
        prompt: ComposedPrompt | Sequence[int],
        inject: bool,
        cache_salt: str | None,
        **sampling: Any,
    ) -> tuple[str, dict[str, Any], Any, GenerationResult]:
        """``(request id, tokens prompt, sampling params, empty result)`` of one request."""
        composed = prompt if isinstance(prompt, ComposedPrompt) else None
        prompt_ids = list(composed.prompt_ids) if composed else list(prompt)  # type: ignore[arg-type]
        kv_params = composed.kv_transfer_params(self.fingerprint) if composed and inject else None
        salt = cache_salt if cache_salt is not None else (composed.cache_salt if composed else None)
        tokens_prompt: dict[str, Any] = {"prompt_token_ids": prompt_ids}
        if salt:
            tokens_prompt["cache_salt"] = salt
        params = self._sampling_params(kv_params, **sampling)
        request_id = f"inferscale-{next(self._ids)}"
        return request_id, tokens_prompt, params, GenerationResult(request_id, len(prompt_ids))

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
    ) -> Iterator[tuple[str, GenerationResult]]:
        """Yield ``(text delta, running result)`` as tokens arrive; the last result is final.

        ``prompt`` is a composed memory request (its KV is injected when ``inject``) or plain
        token ids (prompt injection / no memory). TTFT is measured from submission to the
        first streamed token.
        """
        request_id, tokens_prompt, params, result = self._request(
            prompt,
            inject,
            cache_salt,
            max_tokens=max_tokens,
            temperature=temperature,
            logprobs=logprobs,
            stop=stop,
            prompt_logprobs=prompt_logprobs,
            ignore_eos=ignore_eos,
        )
        with self._lock:
            t0 = time.perf_counter()
            self._engine.add_request(request_id, tokens_prompt, params)
            try:
                while self._engine.has_unfinished_requests():
                    for output in self._engine.step():
                        if output.request_id != request_id:
                            continue
                        delta = _absorb(result, output, t0)
                        if delta or output.finished:
                            yield delta, result
            except BaseException:  # cancelled (GeneratorExit) or failed: free its blocks
                self._engine.abort_request([request_id])
                raise

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
    ) -> list[GenerationResult]:
        """Submit every prompt at once and step until all finish (concurrent users).

        The engine schedules them together, as a server would; each result's ``ttft_s`` and
        ``total_s`` count from the moment the whole batch was submitted. Results come back in
        the order of ``prompts``.
        """
        requests = [
            self._request(
                prompt,
                inject,
                cache_salt,
                max_tokens=max_tokens,
                temperature=temperature,
                logprobs=logprobs,
                stop=None,
                prompt_logprobs=None,
                ignore_eos=ignore_eos,
            )
            for prompt in prompts
        ]
        results = {request_id: result for request_id, _, _, result in requests}
        with self._lock:
            t0 = time.perf_counter()
            for request_id, tokens_prompt, params, _ in requests:
                self._engine.add_request(request_id, tokens_prompt, params)
            try:
                while self._engine.has_unfinished_requests():
                    for output in self._engine.step():
                        if output.request_id in results:
                            _absorb(results[output.request_id], output, t0)
            except BaseException:
                self._engine.abort_request(list(results))
                raise
        return [result for _, _, _, result in requests]

    def generate_json(
        self, prompt_ids: Sequence[int], schema: dict[str, Any], max_tokens: int = 256
    ) -> str:
        """Greedy generation constrained to a JSON schema (vLLM structured outputs)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            structured_outputs=StructuredOutputsParams(json=schema),
        )
        with self._lock:
            (output,) = self.llm.generate(
                [{"prompt_token_ids": list(prompt_ids)}], params, use_tqdm=False
            )
        return output.outputs[0].text

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


def _absorb(result: GenerationResult, output: Any, t0: float) -> str:
    """Fold one DELTA RequestOutput into ``result``; return its new text."""
    now = time.perf_counter()
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
    return completion.text
