"""One thread steps the in-process vLLM engine; any thread submits requests to it.

vLLM's ``LLMEngine`` is not thread-safe, and the chat and the background memory worker both
use it: the chat's turn streams while encoding requests run. So only the driver thread calls
``add_request``, ``abort_request`` and ``step``; callers send commands through a queue and read
their request's outputs from a queue of its own. Requests share every step (continuous
batching); which run first is vLLM's scheduler's call (priority scheduling: chat first).

**Chat first, also within a step.** Priority alone still lets background requests (``yields``:
encoding) fill the rest of the step that computes a chat turn's prompt, and a turn arriving
mid-backlog pays for them. So while a foreground request waits for its first token, background
requests step aside: those still in their prefill are aborted (their computed blocks stay in
vLLM's prefix cache) and re-added, under a new engine id, as soon as every waiting foreground
request has its first token, or after :data:`HOLD_S` at most (so a stream of turns cannot
starve them); new ones wait likewise. A turn then waits for at most the step in flight.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

HOLD_S = 0.5  # the longest background requests are held back for foreground ones


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: dict[str, Any]
    params: Any  # SamplingParams
    priority: int
    outputs: queue.SimpleQueue[Any]
    yields: bool = False  # background: steps aside while foreground prompts are computed
    tries: int = 0  # times added to the engine (a preempted request is added again)

    @property
    def engine_id(self) -> str:
        """The id vLLM knows this try by (an aborted id is not reused)."""
        return self.request_id if self.tries <= 1 else f"{self.request_id}~{self.tries}"


@dataclass(slots=True)
class _Abort:
    request_ids: list[str]


@dataclass(slots=True)
class _Call:
    fn: Any  # Callable[[], Any], run on the driver thread between steps
    result: queue.SimpleQueue[Any]


class RequestFailed(RuntimeError):
    """The engine refused or failed the request; the message is vLLM's."""


DONE = object()  # the last item of a request's output queue


class EngineDriver:
    """Steps ``llm_engine`` on a daemon thread while any request is unfinished.

    A request's queue receives ``(time, RequestOutput)`` per step that produced output for it
    (``time``: ``perf_counter`` when the step returned), then :data:`DONE`; or a
    :class:`RequestFailed` if vLLM refused it.
    """

    def __init__(self, llm_engine: Any) -> None:
        self.engine = llm_engine
        self._commands: queue.SimpleQueue[_Add | _Abort | _Call | None] = queue.SimpleQueue()
        self._admitted: dict[str, _Add] = {}  # engine id -> request, while in the engine
        self._current: dict[str, str] = {}  # request id -> engine id of its current try
        self._waiting_fg: set[str] = set()  # foreground engine ids without output yet
        self._fresh_bg: set[str] = set()  # background engine ids without output yet
        self._held: deque[_Add] = deque()  # background requests waiting for the foreground
        self._held_since: float | None = None
        self.preempted = 0  # background tries aborted for a foreground request (a count)
        self.foreground_idle = threading.Event()  # set while no foreground prompt waits
        self.foreground_idle.set()
        self._thread = threading.Thread(target=self._run, name="vllm-driver", daemon=True)
        self._thread.start()

    def submit(
        self,
        request_id: str,
        prompt: dict[str, Any],
        params: Any,
        priority: int = 0,
        yields: bool = False,
    ) -> queue.SimpleQueue[Any]:
        """Queue a request; its outputs arrive in the returned queue. ``yields``: a background
        request, which steps aside while foreground prompts are computed (module docstring)."""
        outputs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._commands.put(_Add(request_id, prompt, params, priority, outputs, yields))
        return outputs

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the driver thread between two steps and return what it returned
        (e.g. a profiler started for the thread that does the engine's work)."""
        result: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._commands.put(_Call(fn, result))
        ok, value = result.get()
        if not ok:
            raise value
        return value

    def abort(self, request_ids: list[str]) -> None:
        """Stop requests (a reader that went away); their blocks are freed."""
        self._commands.put(_Abort(list(request_ids)))

    def close(self, timeout: float = 10.0) -> None:
        self._commands.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        engine = self.engine
        while True:
            self._release_held()
            busy = engine.has_unfinished_requests()
            try:  # wait for work while idle; between steps only take what is there
                wait = None if not self._held else HOLD_S
                command = self._commands.get(block=not busy, timeout=wait)
            except queue.Empty:
                command = ...
            while command is not ...:
                if command is None:
                    return
                self._handle(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = ...
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # the engine failed: every waiting request hears it
                log.exception("the engine's step failed")
                for request in self._admitted.values():
                    request.outputs.put(RequestFailed(f"the engine failed: {exc}"))
                    self._current.pop(request.request_id, None)
                self._admitted.clear()
                self._waiting_fg.clear()
                self._fresh_bg.clear()
                self.foreground_idle.set()
                continue
            now = time.perf_counter()
            for output in outputs:
                request = self._admitted.get(output.request_id)
                if request is None:
                    continue  # added outside the driver (a bench stepping the engine itself)
                self._waiting_fg.discard(output.request_id)
                self._fresh_bg.discard(output.request_id)
                if not self._waiting_fg:
                    self.foreground_idle.set()
                request.outputs.put((now, output))
                if output.finished:
                    request.outputs.put(DONE)
                    self._forget(output.request_id)

    def _handle(self, command: _Add | _Abort | _Call) -> None:
        if isinstance(command, _Call):
            try:
                command.result.put((True, command.fn()))
            except Exception as exc:
                command.result.put((False, exc))
            return
        if isinstance(command, _Abort):
            self._abort(command.request_ids)
            return
        if command.yields and self._waiting_fg:
            self._hold([command])
            return
        self._admit(command)

    def _admit(self, request: _Add) -> None:
        request.tries += 1
        engine_id = request.engine_id
        # vLLM may keep and adjust the params it was given (skip_clone): a retry gets a copy
        params = request.params if request.tries == 1 else request.params.clone()
        try:
            self.engine.add_request(engine_id, request.prompt, params, priority=request.priority)
        except Exception as exc:  # e.g. a prompt longer than the model's context
            request.outputs.put(RequestFailed(str(exc)))
            return
        self._admitted[engine_id] = request
        self._current[request.request_id] = engine_id
        if request.yields:
            self._fresh_bg.add(engine_id)
        else:
            self._waiting_fg.add(engine_id)
            self.foreground_idle.clear()
            self._preempt()

    def _preempt(self) -> None:
        """Abort the background requests still in their prefill; hold them for later."""
        if not self._fresh_bg:
            return
        ids = [i for i in self._admitted if i in self._fresh_bg]  # in the order added
        self.engine.abort_request(ids)
        self.preempted += len(ids)
        requests = [self._admitted[i] for i in ids]
        for engine_id in ids:
            self._forget(engine_id)
        self._hold(requests, first=True)

    def _hold(self, requests: list[_Add], first: bool = False) -> None:
        for request in reversed(requests) if first else requests:
            if first:
                self._held.appendleft(request)
            else:
                self._held.append(request)
            self._current[request.request_id] = ""  # held: not in the engine
        if self._held_since is None:
            self._held_since = time.perf_counter()

    def _release_held(self) -> None:
        if not self._held:
            return
        held_s = time.perf_counter() - (self._held_since or 0.0)
        if self._waiting_fg and held_s < HOLD_S:
            return
        requests, self._held, self._held_since = list(self._held), deque(), None
        for request in requests:
            self._admit(request)

    def _abort(self, request_ids: list[str]) -> None:
        in_engine = []
        for request_id in request_ids:
            engine_id = self._current.get(request_id)
            if engine_id is None:
                continue  # finished, or never known
            if engine_id:
                in_engine.append(engine_id)
                request = self._admitted[engine_id]
                self._forget(engine_id)
            else:
                request = next(r for r in self._held if r.request_id == request_id)
                self._held.remove(request)
                self._current.pop(request_id, None)
            request.outputs.put(DONE)
        if in_engine:
            self.engine.abort_request(in_engine)

    def _forget(self, engine_id: str) -> None:
        request = self._admitted.pop(engine_id)
        self._waiting_fg.discard(engine_id)
        self._fresh_bg.discard(engine_id)
        if not self._waiting_fg:
            self.foreground_idle.set()
        if self._current.get(request.request_id) == engine_id:
            del self._current[request.request_id]
