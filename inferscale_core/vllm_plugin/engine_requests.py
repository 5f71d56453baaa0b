"""What both engines do per request: vLLM's inputs from a composed prompt, and its outputs,
read from the request's queue, back into a :class:`~inferscale_core.types.GenerationResult`.

:class:`QueuedRequests` gives ``stream``, ``generate``, ``generate_batch``, ``generate_json``
and ``warm_up`` to an engine that hands each request to vLLM and gets its outputs in a queue
of its own (``_enqueue``): the in-process engine's driver thread (``vllm_engine.py``) or the
serving engine's event loop (``serving_engine.py``). A queue holds ``(time, RequestOutput)``
per step, then :data:`~inferscale_core.vllm_plugin.driver.DONE`, or a ``RequestFailed``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Any

from inferscale_core.composer import KV_PARAMS_KEY, ComposedPrompt
from inferscale_core.engine import CHAT_PRIORITY
from inferscale_core.request_signing import sign
from inferscale_core.types import GenerationResult
from inferscale_core.vllm_plugin.driver import DONE, RequestFailed


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
    min_tokens: int = 0,
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
        min_tokens=min_tokens,
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


class QueuedRequests:
    """The request calls of an engine over ``_enqueue`` and ``abort`` (module docstring)."""

    fingerprint: str
    # Signs each request's kv_transfer_params (request_signing.py): None in-process, where the
    # app is the engine's only client; the serving engine's per-start key.
    request_key: bytes | None = None
    stream_every_token = False  # stream yields steps with tokens that make no text yet
    aborted = 0  # requests stopped because their reader went away or failed (a count)
    _ids: itertools.count[int]  # request ids (each engine makes its own)
    # vLLM makes its own ids unique; this one names the API process in logs (several share
    # one engine core).
    request_prefix = "inferscale-"

    def _enqueue(
        self, request_id: str, tokens_prompt: dict[str, Any], params: Any, priority: int
    ) -> Any:
        """Hand a request to vLLM; return the queue its outputs arrive in."""
        raise NotImplementedError

    def abort(self, request_ids: Sequence[str]) -> None:
        """Stop requests (their blocks are freed)."""
        raise NotImplementedError

    def _submit(
        self,
        prompt: ComposedPrompt | Sequence[int],
        inject: bool = True,
        cache_salt: str | None = None,
        priority: int = CHAT_PRIORITY,
        **sampling: Any,
    ) -> tuple[str, Any, GenerationResult, float]:
        """Hand one request to the engine: ``(id, its output queue, empty result, t0)``."""
        request_id, tokens_prompt, params, result = self._request(
            prompt, inject, cache_salt, **sampling
        )
        t0 = time.perf_counter()
        return request_id, self._enqueue(request_id, tokens_prompt, params, priority), result, t0

    def _request(
        self,
        prompt: ComposedPrompt | Sequence[int],
        inject: bool,
        cache_salt: str | None,
        **sampling: Any,
    ) -> tuple[str, dict[str, Any], Any, GenerationResult]:
        """``(request id, tokens prompt, SamplingParams, empty result)`` of one request."""
        tokens_prompt, kv_params = request_inputs(
            prompt, inject, cache_salt, self.fingerprint, self.request_key
        )
        request_id = f"{self.request_prefix}{next(self._ids)}"
        result = GenerationResult(request_id, len(tokens_prompt["prompt_token_ids"]))
        return request_id, tokens_prompt, sampling_params(kv_params, **sampling), result

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
        min_tokens: int = 0,
    ) -> Iterator[tuple[str, GenerationResult]]:
        """Yield ``(text delta, running result)`` as tokens arrive; the last result is final.

        ``prompt`` is a composed memory request (its KV is injected when ``inject``) or plain
        token ids (prompt injection / no memory). TTFT is measured from submission to the
        step that produced the first token. Other requests (the memory worker's encodes) share
        the engine's steps; ``priority`` (lower first) decides who waits. ``temperature``,
        ``top_p``, ``top_k``, ``repetition_penalty`` and ``min_tokens`` are vLLM's sampling
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
            min_tokens=min_tokens,
        )
        finished = False
        try:
            while (item := outputs.get()) is not DONE:
                if isinstance(item, RequestFailed):
                    raise item
                at, output = item
                delta = absorb(result, output, t0, at)
                finished = output.finished
                # A server streams every step with tokens, even before they make text.
                if delta or finished or (self.stream_every_token and output.outputs[0].token_ids):
                    yield delta, result
        finally:
            if not finished:  # cancelled (GeneratorExit) or failed: free its blocks
                self.aborted += 1
                self.abort([request_id])

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
                self.abort(pending)
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
