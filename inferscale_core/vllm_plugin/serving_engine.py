"""vLLM's multi-process async engine (``AsyncLLM``) with the InferScale connector, for serving.

The in-process engine (``vllm_engine.VllmEngine``) steps ``LLMEngine`` on one thread of the
app's process; this one runs vLLM as ``vllm serve`` does: the engine core (scheduler, and the
connector's scheduler side) and the workers (the connector's worker side, the KV cache) in
their own processes, many requests in flight, outputs pulled by an asyncio task. The connector
there opens the store from ``kv_connector_extra_config`` alone (``connector.py``); this
process only composes requests and reads the store's files.

It offers the same :class:`~inferscale_core.engine.Engine` protocol as the in-process engine,
so sessions and memory workers run on it unchanged: vLLM's event loop runs on a thread of its
own, and each call from another thread bridges to it. Every in-flight request is independent:
a reader that stops early aborts only its own request.

What it does not do that the in-process driver does: background (encoding) requests do not
step aside inside a step for a chat prompt; vLLM's priority scheduling still runs chat
prompts first.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from inferscale_core.composer import ComposedPrompt
from inferscale_core.engine import CHAT_PRIORITY
from inferscale_core.types import GenerationResult
from inferscale_core.vllm_plugin.driver import DONE, RequestFailed
from inferscale_core.vllm_plugin.engine_group import EngineClient, engine_args, with_request_key
from inferscale_core.vllm_plugin.engine_requests import QueuedRequests, absorb
from inferscale_core.vllm_plugin.vllm_engine import EngineOptions, prepare_environment

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


class ServingEngine(QueuedRequests):
    """``AsyncLLM`` in its default multi-process mode, behind the sync ``Engine`` protocol."""

    stream_every_token = True  # a server streams the first token at once

    def __init__(self, options: EngineOptions, client: EngineClient | None = None) -> None:
        on_gpu = prepare_environment(options, multiprocessing=True)
        if on_gpu:  # this process may have touched CUDA already: a forked engine could not
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        # The engine core (a child of this process) goes when this process does, even by
        # kill -9 (lifetime.py); the connector there reads this pid. Loads and captures only
        # this process asked for: its params are signed with a key only vLLM's processes and
        # this one know (request_signing.py). With a client, this is one of several API
        # processes of an engine core another process started, with that one's key.
        options = with_request_key(options) if client is None else client.options
        self.request_key = bytes.fromhex(options.connector_extra["request_key"])
        self.options = options
        self.fingerprint = options.fingerprint
        self._client = client
        self._on_gpu = on_gpu
        self._ids = itertools.count()
        if client is not None:  # ids in the engine core's log tell the API processes apart
            self.request_prefix = f"inferscale-{client.index}-"
        self._lock = threading.Lock()
        self._waiting_fg: set[str] = set()  # chat requests without their first token yet
        self.foreground_idle = threading.Event()
        self.foreground_idle.set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-async")
        self._thread.daemon = True
        self._thread.start()
        t0 = time.perf_counter()
        self.llm: AsyncLLM = self._call(self._start()).result()
        self.startup_s = time.perf_counter() - t0
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(options.model_dir))

    async def _start(self) -> AsyncLLM:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        client = self._client
        if client is None:
            return AsyncLLM.from_engine_args(engine_args(self.options, self._on_gpu, 1, 0))
        args = engine_args(self.options, self._on_gpu, client.count, client.index)
        vllm_config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        addresses = dict(client.config)
        count, index = addresses.pop("client_count"), addresses.pop("client_index")
        return AsyncLLM.from_vllm_config(
            vllm_config,
            disable_log_stats=args.disable_log_stats,
            client_addresses=addresses,
            client_count=count,
            client_index=index,
        )

    def _call(self, coroutine: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # ---- what the session and the server read ----
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        return int(self.llm.model_config.max_model_len)

    @property
    def block_size(self) -> int:
        return int(self.llm.vllm_config.cache_config.block_size)

    @property
    def step_tokens(self) -> int:
        return int(self.llm.vllm_config.scheduler_config.max_num_batched_tokens)

    def unfinished_requests(self) -> int:
        """Requests vLLM still tracks (0 once every reader finished or went away); call it
        on this engine's loop (:meth:`run`) or any other thread."""
        if threading.current_thread() is self._thread:
            return int(self.llm.output_processor.get_num_unfinished_requests())
        return int(self._call(self._unfinished()).result())

    async def _unfinished(self) -> int:
        return self.llm.output_processor.get_num_unfinished_requests()

    # ---- requests ----
    async def _pump(
        self,
        request_id: str,
        tokens_prompt: dict[str, Any],
        params: Any,
        priority: int,
        outputs: queue.SimpleQueue[Any],
    ) -> None:
        """Feed one request's outputs to its reader's queue: ``(time, output)``..., DONE."""
        try:
            async for output in self.llm.generate(
                tokens_prompt, params, request_id, priority=priority
            ):
                self._first_output(request_id)
                outputs.put((time.perf_counter(), output))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # vLLM refused it, or the engine died
            outputs.put(RequestFailed(str(exc) or type(exc).__name__))
        finally:
            self._first_output(request_id)
            outputs.put(DONE)

    def _first_output(self, request_id: str) -> None:
        with self._lock:
            self._waiting_fg.discard(request_id)
            if not self._waiting_fg:
                self.foreground_idle.set()

    def _enqueue(
        self, request_id: str, tokens_prompt: dict[str, Any], params: Any, priority: int
    ) -> queue.SimpleQueue[Any]:
        outputs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        if priority <= CHAT_PRIORITY:  # a chat request: background work waits for it
            with self._lock:
                self._waiting_fg.add(request_id)
                self.foreground_idle.clear()
        self._call(self._pump(request_id, tokens_prompt, params, priority, outputs))
        return outputs

    def abort(self, request_ids: Sequence[str]) -> None:
        self._call(self.llm.abort(list(request_ids)))

    async def astream(
        self,
        prompt: ComposedPrompt | Sequence[int],
        *,
        inject: bool = True,
        cache_salt: str | None = None,
        priority: int = CHAT_PRIORITY,
        **sampling: Any,
    ) -> AsyncIterator[tuple[str, GenerationResult]]:
        """:meth:`stream` for a coroutine on this engine's event loop (:meth:`run`): vLLM's
        outputs reach the caller with no thread in between. Leaving the iteration early (or
        being cancelled: a client gone) aborts the request."""
        defaults = {"max_tokens": 256, "temperature": 0.0, "logprobs": None, "stop": None}
        sampling = {**defaults, "prompt_logprobs": None, **sampling}
        request_id, tokens_prompt, params, result = self._request(
            prompt, inject, cache_salt, **sampling
        )
        t0 = time.perf_counter()
        finished = False
        outputs = self.llm.generate(tokens_prompt, params, request_id, priority=priority)
        try:
            async with contextlib.aclosing(outputs):  # closed at once when we stop
                async for output in outputs:
                    delta = absorb(result, output, t0, time.perf_counter())
                    finished = output.finished
                    if delta or finished or output.outputs[0].token_ids:
                        yield delta, result
        finally:
            if not finished:  # vLLM aborts it as its generator closes; counted here
                self.aborted += 1

    def schedule(self, coroutine: Any) -> Future[Any]:
        """Start ``coroutine`` on this engine's event loop and return at once: its future
        (``cancel()`` cancels it there). For a host that has an event loop of its own (a Ray
        Serve replica, ``app/serve/ray_app.py``)."""
        return self._call(coroutine)

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on this engine's event loop (e.g. the HTTP server, whose
        handlers then call :meth:`astream`) and wait for it. Ctrl+C cancels it."""
        future = self._call(coroutine)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise

    def wait_for_chat(self, timeout: float | None = None) -> bool:
        """True once no chat request waits for its first token, False after ``timeout``."""
        return self.foreground_idle.wait(timeout)

    def close(self) -> None:
        """Shut vLLM's processes down and stop the event loop's thread."""
        llm, self.llm = self.llm, None  # type: ignore[assignment]
        llm.shutdown()  # now, not from its __del__ at interpreter exit (which fails then)
        del llm
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
