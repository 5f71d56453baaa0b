"""``serve --ray N``: the server as a Ray Serve application, N replicas with an engine each.

Two deployments, over one data folder that every replica reaches (``memory.db``, ``users.db``,
``kv/``, ``inbox/``, ``leases/``):

* :class:`Replica` (N): one vLLM engine with the connector and the server's own app
  (``server.py``: the same routes, edge and checks as ``serve``). A request comes with its
  user's id as Ray Serve's *multiplexed model id*; the router (``ray_router.py``) sends it to
  the replica that holds the user's lease, or, for a user no live replica holds, to the one
  rendezvous hashing picks. A replica keeps at most ``desks`` users and unloads the least
  recently used (Ray's model multiplexing). A user's desk is opened only under their lease
  (``lease.py``), so one replica at a time writes their memory. Unloading waits for the user's
  requests on the replica to end, closes the desk (what its thread was given is written first),
  then gives the lease up. A replica that dies, ``kill -9`` too, loses its leases with it (the
  kernel drops its locks): the next replica a user's request reaches takes them over from the
  shared folder, and everything that got a 2xx is there.
* ``Front`` (``ray_front.py``; the ingress, behind Ray's HTTP proxy): the edge (the token,
  then the size, before a byte of the body is read), then the request to its user's replica
  and the response streamed back. A client that goes away cancels the replica's call, which
  aborts the engine request, as in ``serve``.

The token's user decides the route and the replica checks the token again: nothing a client
sends names a user, a desk or a KV entry. On one host a local Ray is started on loopback;
``--ray-address`` joins a cluster (docs/SERVING.md says what several nodes need).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.serve.ray_front import Front, Relayed, front_api

if TYPE_CHECKING:
    from app.serve.launch import ServeRecipe

log = logging.getLogger(__name__)

APP_NAME = "inferscale"
DESKS_PER_REPLICA = 64  # users a replica keeps loaded (desks open, leases held)
MAX_ONGOING = 1024  # requests in flight per replica: vLLM batches them; Ray must not spill a
# user's requests to a replica without their desk because of a low cap (Ray's default is 5)
RAY_ENV_PREFIXES = ("INFERSCALE_", "VLLM_", "HF_", "TRANSFORMERS_", "OMP_", "CUDA_")
# Ray Serve's own logs: warnings and errors, no access lines (paths would be all they hold,
# but `serve` keeps those for --verbose)
QUIET = {"log_level": "WARNING", "enable_access_log": False}


# ---- the replica -------------------------------------------------------------------------


class Replica:
    """One engine and the server's app over it; the users Ray routes here (see the module)."""

    def __init__(self, recipe: ServeRecipe, desks: int, lease_wait_s: float) -> None:
        from ray import serve

        from app.serve.launch import build
        from app.serve.lease import Leases
        from app.serve.ray_router import replica_holder

        os.umask(0o077)  # as `serve`: what it makes is the server's alone
        replica_id = serve.get_replica_context().replica_id.unique_id
        holder = replica_holder(replica_id, socket.gethostname(), os.getpid())  # the router reads
        self.built = build(
            recipe, leases=Leases(recipe.folder / "leases", holder), lease_wait_s=lease_wait_s
        )
        self.engine = self.built.assistant.engine  # ServingEngine: its event loop on a thread
        self._active: Counter[str] = Counter()  # user id -> their requests on this replica
        self._idle = threading.Condition()

        async def load(user_id: str) -> _Loaded:
            return _Loaded(self, user_id)  # the desk itself opens on the first route's call

        self._load = serve.multiplexed(max_num_models_per_replica=desks)(load)

    async def http(self, request: Relayed) -> AsyncIterator[tuple[int, list[Any]] | bytes]:
        """Run ``request`` through the app: ``(status, headers)``, then the body's pieces."""
        from ray import serve

        user_id = serve.get_multiplexed_model_id()
        if user_id:
            await self._load(user_id)
            self._enter(user_id)  # no await since the load: the user cannot be unloaded between
        try:
            async for item in self._call_app(request):
                yield item
        finally:
            if user_id:
                self._leave(user_id)

    def unload(self, user_id: str) -> None:
        """Ray unloads ``user_id`` (the least recently used): once their requests here have
        ended, close their desk and give up their lease."""
        with self._idle:
            self._idle.wait_for(lambda: self._active[user_id] == 0)
            del self._active[user_id]
        if not self.built.hub.release(user_id):
            log.warning("a user's desk did not close in time: their lease stays with this replica")

    def _enter(self, user_id: str) -> None:
        with self._idle:
            self._active[user_id] += 1

    def _leave(self, user_id: str) -> None:
        with self._idle:
            self._active[user_id] -= 1
            self._idle.notify_all()

    async def _call_app(self, request: Relayed) -> AsyncIterator[tuple[int, list[Any]] | bytes]:
        """The ASGI app on the engine's event loop (where the server's handlers run, as under
        uvicorn), its messages carried back to this (Ray's) loop. Cancelled here (the client
        went away): the app sees a disconnect and its task is cancelled, which aborts the
        engine request."""
        here = asyncio.get_running_loop()
        messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        gone = asyncio.Event()  # used on the engine's loop only
        pending = [request.body]

        async def receive() -> dict[str, Any]:
            if pending:
                return {"type": "http.request", "body": pending.pop(), "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            here.call_soon_threadsafe(messages.put_nowait, message)

        future = self.engine.schedule(self.built.app(request.scope(), receive, send))
        future.add_done_callback(lambda _: here.call_soon_threadsafe(messages.put_nowait, None))
        try:
            while (message := await messages.get()) is not None:
                if message["type"] == "http.response.start":
                    yield message["status"], list(message.get("headers", []))
                elif message["type"] == "http.response.body" and message.get("body"):
                    yield bytes(message["body"])
            future.result()  # the app's own failure, if any
        finally:
            if not future.done():
                self.engine.schedule(_set(gone))
                future.cancel()

    def __del__(self) -> None:
        built = getattr(self, "built", None)
        if built is not None:
            self.built = None
            built.close()


async def _set(event: asyncio.Event) -> None:
    event.set()


class _Loaded:
    """A user loaded on a replica: Ray's multiplexed "model". Ray calls ``__del__`` when it
    unloads the user (in a thread: it waits for their requests to end)."""

    def __init__(self, replica: Replica, user_id: str) -> None:
        self.replica: Replica | None = replica
        self.user_id = user_id

    def __del__(self) -> None:
        replica, self.replica = self.replica, None  # once, whoever calls it
        if replica is not None:
            replica.unload(self.user_id)


# ---- running it --------------------------------------------------------------------------


@dataclass(slots=True)
class RaySettings:
    replicas: int = 2
    desks: int = DESKS_PER_REPLICA
    address: str | None = None  # a Ray cluster to join; None: start one on this host
    lease_wait_s: float = 10.0
    gpus_per_replica: float = 0.0  # 1/replicas on a GPU host: they share its GPUs


def application(recipe: ServeRecipe, settings: RaySettings) -> Any:
    """The Ray Serve application: the front over ``settings.replicas`` replicas."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from app.serve.ray_router import LeaseRouter

    env = {k: v for k, v in os.environ.items() if k.startswith(RAY_ENV_PREFIXES)}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    options: dict[str, Any] = {"num_cpus": 0, "runtime_env": {"env_vars": env}}
    replica = serve.deployment(
        Replica,
        name="Replica",
        num_replicas=settings.replicas,
        max_ongoing_requests=MAX_ONGOING,
        ray_actor_options=dict(options, num_gpus=settings.gpus_per_replica),
        health_check_timeout_s=60,
        request_router_config=RequestRouterConfig(
            request_router_class=LeaseRouter,
            request_router_kwargs={"leases_folder": str(recipe.folder / "leases")},
        ),
        logging_config=QUIET,
        graceful_shutdown_timeout_s=20,
    )
    front = serve.deployment(serve.ingress(front_api)(Front), name="Front", logging_config=QUIET)
    front = front.options(
        num_replicas=1,
        max_ongoing_requests=MAX_ONGOING * settings.replicas,
        ray_actor_options=options,
    )
    users_db = str(recipe.users_db)
    return front.bind(replica.bind(recipe, settings.desks, settings.lease_wait_s), users_db)


def serve_ray(
    recipe: ServeRecipe,
    host: str,
    port: int,
    settings: RaySettings,
    on_ready: Callable[[str], None] = lambda name: None,
) -> None:
    """Run the application on Ray Serve (``host:port``, Ray's HTTP proxy) until Ctrl+C or
    SIGTERM; then shut it down (a local Ray with it)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no telemetry: before Ray is imported
    import ray
    from ray import serve

    from app.serve.launch import served_name
    from inferscale_core.factlog import FactLog
    from inferscale_core.model_files import resolve_model

    if 0 < settings.gpus_per_replica < 1:  # replicas sharing a GPU: each its share of vLLM's
        share = 0.5 * settings.gpus_per_replica  # default half
        recipe.engine_options.setdefault("gpu_memory_utilization", share)
    # Created and migrated here, once: N replicas opening a new file at once would race.
    FactLog.open(recipe.folder / "memory.db").close()
    if settings.address is None:  # a Ray of our own, on loopback, its dashboard off
        ray.init(
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            configure_logging=False,
        )
    else:
        ray.init(address=settings.address)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(
            application(recipe, settings), name=APP_NAME, route_prefix="/", logging_config=QUIET
        )
        model = resolve_model(recipe.config.model, progress=False, weights=recipe.config.weights)
        name = recipe.model_name or served_name(model)
        on_ready(name)
        stop.wait()
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP_NAME)
            serve.shutdown()
        ray.shutdown()
