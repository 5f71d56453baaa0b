"""Build and run the HTTP server: in one process, or as several API processes behind a front.

:class:`ServeRecipe` says how to build one API process's server (the settings, the server's
folder, the engine's options, the embedder); it is picklable, so each spawned API process
builds its own from it. :func:`serve` runs it:

* one process (``processes=1``): the engine's client, every user's desk and the HTTP
  listener in this process (vLLM's engine core and workers in their own, as always);
* ``processes=N``: vLLM's engine core serving N API processes (``engine_group.py``, as
  ``vllm serve --api-server-count N``), each with the desks of the users it owns on a Unix
  socket of its own, and this process the public listener (``front.py``) that passes each
  request to its user's process. N processes, N GILs: on the H200 at k=50 one process
  served 24–28 requests a second, 8 served 110 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from app.serve.hub import Hub
    from app.serve.lease import Leases
    from app.serve.users import Users
    from inferscale_core import wiring
    from inferscale_core.config import AppConfig
    from inferscale_core.embedder import Embedder
    from inferscale_core.vllm_plugin.engine_group import EngineClient

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 900.0  # for every API process to answer /health (engine start included)
SOCKETS_PREFIX = "serve-"  # + the front's pid: the API processes' sockets (socket_folder)


@dataclass(slots=True)
class ServeRecipe:
    """How to build one API process's server (picklable)."""

    config: AppConfig
    folder: Path  # the server's: memory.db, users.db, kv/, inbox/
    engine_options: dict[str, Any] = field(default_factory=dict)  # wiring.build's
    model_name: str | None = None  # the served name; None: the model folder's name
    embedder: Callable[[], Embedder] | None = None  # None: the product's (MiniLM)
    verbose: bool = False

    @property
    def users_db(self) -> Path:
        return self.folder / "users.db"


@dataclass(slots=True)
class Built:
    app: FastAPI
    hub: Hub
    users: Users
    assistant: wiring.Assistant
    name: str  # the served model name

    def close(self) -> None:
        self.hub.close()
        self.users.close()
        close = getattr(self.assistant.engine, "close", None)
        if close is not None:
            close()


def served_name(model_dir: Path) -> str:
    """The model's name in the API: its folder's, without the cache's content hash."""
    return re.sub(r"-[0-9a-f]{12}$", "", model_dir.name)


def build(
    recipe: ServeRecipe,
    client: EngineClient | None = None,
    *,
    leases: Leases | None = None,
    lease_wait_s: float | None = None,
) -> Built:
    """The app over the serving engine (attached to ``client``'s engine core when given);
    with ``leases``, each user's desk opened under their lease (``hub.py``)."""
    from app.serve.hub import Hub
    from app.serve.server import create_app
    from app.serve.users import Users
    from inferscale_core import wiring

    options = dict(recipe.engine_options)
    if client is not None:
        options["engine_client"] = client
    assistant = wiring.build(
        recipe.config, store_root=recipe.folder / "kv", serving=True, **options
    )
    embedder = recipe.embedder() if recipe.embedder is not None else None
    waits = {} if lease_wait_s is None else {"lease_wait_s": lease_wait_s}
    hub = Hub(
        assistant, recipe.config, recipe.folder / "memory.db", embedder, leases=leases, **waits
    )
    name = recipe.model_name or served_name(assistant.model_dir)
    index = client.index if client is not None else 0
    users = Users(recipe.users_db)
    app = create_app(hub, users, name, inbox=recipe.folder / "inbox", api_process=index)
    return Built(app, hub, users, assistant, name)


def serve(
    recipe: ServeRecipe,
    host: str,
    port: int,
    processes: int = 1,
    on_ready: Callable[[str], None] = lambda name: None,
) -> None:
    """Serve ``recipe`` on ``host:port`` until Ctrl+C / SIGTERM (``on_ready(model name)``
    once it answers)."""
    if processes == 1:
        from app.serve.server import run_server

        built = build(recipe)
        on_ready(built.name)
        try:
            run_server(built.app, built.assistant.engine, host, port, verbose=recipe.verbose)
        finally:
            built.close()
        return
    _serve_group(recipe, host, port, processes, on_ready)


def _serve_group(
    recipe: ServeRecipe, host: str, port: int, count: int, on_ready: Callable[[str], None]
) -> None:
    import contextlib

    import uvicorn

    from app.serve.edge import Edge
    from app.serve.front import Front
    from app.serve.server import KEEP_ALIVE_S, MAX_BODY_BYTES, MAX_IMPORT_BYTES
    from inferscale_core import wiring
    from inferscale_core.factlog import FactLog
    from inferscale_core.vllm_plugin.engine_group import EngineGroup

    # Created and migrated here, once: N processes opening a new file at once would race.
    FactLog.open(recipe.folder / "memory.db").close()
    run = socket_folder(recipe.folder)
    sockets = [run / f"api-{i}.sock" for i in range(count)]
    options = wiring.engine_options(
        recipe.config, store_root=recipe.folder / "kv", **recipe.engine_options
    )
    group = EngineGroup(options, count, _api_process, (recipe, sockets))
    stopped = threading.Event()
    closing = threading.Event()  # set when this process stops the group (Ctrl+C, an error)
    server: uvicorn.Server | None = None

    def watch() -> None:  # an API process or the engine core ended: stop the front
        ended = group.wait()
        stopped.set()
        if closing.is_set():
            return  # they end because this process stops them: nothing to report
        log.error("%s: the server stops", ended)
        if server is not None:
            server.should_exit = True

    threading.Thread(target=watch, name="engine-group", daemon=True).start()
    try:
        name = _wait_ready(sockets, stopped)
        front = Front(recipe.users_db, sockets)
        # The API processes' own edge: the token, then the size, before a body is read.
        edge = Edge(front, front.users.authenticate, MAX_BODY_BYTES, MAX_IMPORT_BYTES)  # type: ignore[arg-type]
        config = uvicorn.Config(
            edge,
            host=host,
            port=port,
            log_level="info" if recipe.verbose else "warning",
            access_log=recipe.verbose,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=5,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        on_ready(name)
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
    finally:
        closing.set()
        group.shutdown()
        shutil.rmtree(run, ignore_errors=True)


def socket_folder(data: Path) -> Path:
    """A new private folder (0700) for the API processes' Unix sockets, named after this
    process: in the user's runtime dir (``$XDG_RUNTIME_DIR``, which the system empties at
    logout), else in ``<data>/run``, else in the temp dir, the first whose socket paths fit a
    Unix socket's 107 bytes. Folders there of a server that is gone (killed: its pid is not
    running) are removed first."""
    import platformdirs

    runtime = Path(platformdirs.user_runtime_dir("inferscale-assistant", appauthor=False))
    roots = [runtime] if runtime.parent.is_dir() else []
    roots += [data / "run", Path(tempfile.gettempdir()) / f"inferscale-{os.getuid()}"]
    for root in roots:
        if len(f"{root}/{SOCKETS_PREFIX}{os.getpid()}-xxxxxxxx/api-999.sock") > 107:
            continue
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(root, 0o700)
        except OSError:  # not ours to write: the next
            continue
        for folder in root.glob(f"{SOCKETS_PREFIX}*"):
            pid = folder.name.removeprefix(SOCKETS_PREFIX).partition("-")[0]
            if pid.isdigit() and not _running(int(pid)):
                shutil.rmtree(folder, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{SOCKETS_PREFIX}{os.getpid()}-", dir=root))
    raise RuntimeError(f"no folder for the API processes' sockets among {roots}")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _wait_ready(sockets: Sequence[Path], stopped: threading.Event) -> str:
    """Wait until every API process answers /health; the served model name."""
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = list(sockets)
    name = ""
    while pending:
        if stopped.is_set():
            raise RuntimeError("an API process or vLLM's engine core stopped while starting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"API processes not up in {READY_TIMEOUT_S:.0f} s: {pending}")
        path = pending[0]
        try:
            transport = httpx.HTTPTransport(uds=str(path))
            with httpx.Client(transport=transport, base_url="http://api", timeout=5) as client:
                r = client.get("/health")
            if r.is_success:
                name = r.json().get("model", name)
                pending.pop(0)
                continue
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    return name


def _api_process(client: EngineClient, spec: tuple[ServeRecipe, list[Path]]) -> None:
    """One API process: its server on its Unix socket, until the front stops it."""
    from app.serve.server import run_server
    from app.startup import quiet_engine_logs

    recipe, sockets = spec
    if not recipe.verbose:
        quiet_engine_logs()
    built = build(recipe, client)
    try:
        run_server(
            built.app,
            built.assistant.engine,
            uds=str(sockets[client.index]),
            verbose=recipe.verbose,
        )
    finally:
        built.close()
