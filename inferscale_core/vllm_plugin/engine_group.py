"""One vLLM engine core serving several API processes, as ``vllm serve --api-server-count N``.

One Python process served 24–28 requests a second on the H200 at k=50 (one GIL for retrieval,
composition, HTTP and vLLM's output processing, ~35 ms of CPU a request; docs/BENCHMARKS.md),
8 processes 110. vLLM's own answer is several API processes over
one engine core, each with its own ``AsyncLLM`` client (input and output sockets of its own,
``client_index``); the engine core schedules all of their requests together. This module starts
that with vLLM's own pieces (``launch_core_engines``, ``APIServerProcessManager``), the
connector configured as in a single-process server, and runs ``target(EngineClient, payload)``
in each spawned API process; :class:`~inferscale_core.vllm_plugin.serving_engine.ServingEngine`
attaches to the engine core from there (``ServingEngine(options, client=...)``).

vLLM's set-up differs between the versions we run: 0.32 binds the engine's sockets here and
hands them to the API processes (``bind_engine_zmq_listeners``); 0.26 lets each API process
bind its own and report the address (``get_engine_zmq_addresses``, ``gather_actual_addresses``).
"""

from __future__ import annotations

import inspect
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing import connection
from typing import Any

from inferscale_core.vllm_plugin.lifetime import die_with_parent
from inferscale_core.vllm_plugin.vllm_engine import (
    EngineOptions,
    engine_arguments,
    prepare_environment,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineClient:
    """What an API process needs to attach to the engine core (picklable)."""

    options: EngineOptions  # the same as the engine core's, its request key included
    config: dict[str, Any]  # vLLM's client config: sockets, client_count, client_index
    index: int  # this API process's number, 0..count-1
    count: int


def with_request_key(options: EngineOptions) -> EngineOptions:
    """``options`` with what every process of one server shares: the key that signs the
    requests' load plans (request_signing.py) and the pid the engine core dies with."""
    extra = {"parent_pid": os.getpid(), "request_key": secrets.token_bytes(32).hex()}
    return replace(options, connector_extra={**options.connector_extra, **extra})


def engine_args(options: EngineOptions, on_gpu: bool, count: int, rank: int) -> Any:
    """vLLM's ``AsyncEngineArgs`` of ``options`` for API process ``rank`` of ``count`` (-1:
    the process that starts the engine core)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    stats = os.environ.get("INFERSCALE_VLLM_STATS") == "1"  # serving_engine.py says why
    args = AsyncEngineArgs(**engine_arguments(options, on_gpu), disable_log_stats=not stats)
    args._api_process_count = count
    args._api_process_rank = rank
    return args


class EngineGroup:
    """vLLM's engine core and ``count`` API processes, each running ``target(client,
    payload)`` (a module-level function: the processes are spawned). :meth:`wait` blocks
    until one of them ends; :meth:`shutdown` stops them all."""

    def __init__(
        self,
        options: EngineOptions,
        count: int,
        target: Callable[[EngineClient, Any], None],
        payload: Any,
    ) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine import utils as engine_utils
        from vllm.v1.executor import Executor
        from vllm.v1.utils import APIServerProcessManager

        if count < 1:
            raise ValueError(f"at least one API process, not {count}")
        on_gpu = prepare_environment(options, multiprocessing=True)
        if on_gpu:
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        options = with_request_key(options)
        args = engine_args(options, on_gpu, count, -1)
        vllm_config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        executor = Executor.get_class(vllm_config)
        log_stats = not args.disable_log_stats
        spec = (target, options, payload, count)
        manager_params = inspect.signature(APIServerProcessManager.__init__).parameters
        common = dict(
            listen_address="",
            sock=None,
            args=spec,
            num_servers=count,
            target_server_fn=_api_process,
        )
        self._listeners: Any = None
        if "input_listeners" in manager_params:  # vLLM 0.32
            listeners = self._listeners = engine_utils.bind_engine_zmq_listeners(vllm_config, count)
            with engine_utils.launch_core_engines(
                vllm_config, executor, log_stats, listeners.addresses
            ) as launch:
                self.api = APIServerProcessManager(
                    **common,
                    input_listeners=listeners.inputs,
                    output_listeners=listeners.outputs,
                    stats_update_address=_stats_address(launch.coordinator),
                    tensor_queue=launch.tensor_queue,
                )
                launch.watched_frontend_processes = self.api.processes
            self.engines, self.coordinator = launch.engine_manager, launch.coordinator
        else:  # vLLM 0.26
            addresses = engine_utils.get_engine_zmq_addresses(
                vllm_config, count, defer_api_server_ports=True
            )
            with engine_utils.launch_core_engines(
                vllm_config, executor, log_stats, addresses, count
            ) as (engines, coordinator, addresses, tensor_queue):
                self.api = APIServerProcessManager(
                    **common,
                    input_addresses=addresses.inputs,
                    output_addresses=addresses.outputs,
                    stats_update_address=_stats_address(coordinator),
                    tensor_queue=tensor_queue,
                )
                addresses.inputs, addresses.outputs = self.api.gather_actual_addresses()
            self.engines, self.coordinator = engines, coordinator
        self.options = options

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.api.processes if p.pid is not None]

    def wait(self) -> str:
        """Until an API process or the engine core ends: which one, and its exit code. (Not
        vLLM's ``wait_for_completion_or_failure``: it logs an error for every process that
        :meth:`shutdown` stops.)"""
        processes = [*self.api.processes, *getattr(self.engines, "processes", [])]
        if self.coordinator is not None:
            processes.append(self.coordinator.proc)
        by_sentinel = {process.sentinel: process for process in processes}
        ended = by_sentinel[connection.wait(list(by_sentinel))[0]]
        ended.join(1)
        return f"{ended.name} (pid {ended.pid}) ended with exit code {ended.exitcode}"

    def shutdown(self, timeout: float | None = 10.0) -> None:
        self.api.shutdown(timeout=timeout)
        if self.engines is not None:
            self.engines.shutdown(timeout=timeout)
        if self.coordinator is not None:
            self.coordinator.shutdown(timeout=timeout)
        listeners, self._listeners = self._listeners, None
        if listeners is not None:  # the front's sockets (vLLM 0.32), closed now
            listeners.cleanup()


def _stats_address(coordinator: Any) -> str | None:
    return coordinator.get_stats_publish_address() if coordinator else None


def _api_process(listen_address: str, sock: Any, spec: Any, client_config: dict) -> None:
    """An API process (vLLM's ``target_server_fn``): dies with the process that started it,
    then runs the caller's target."""
    from vllm.utils.system_utils import set_process_title

    target, options, payload, count = spec
    die_with_parent(options.connector_extra["parent_pid"])
    index = int(client_config["client_index"])
    set_process_title("APIServer", str(index))  # as vLLM's own: VLLM::APIServer_<i> in ps
    target(EngineClient(options, dict(client_config), index, count), payload)
