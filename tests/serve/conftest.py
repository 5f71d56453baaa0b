"""A real ``inferscale-assistant serve`` on loopback: its own process (vLLM's engine core and
worker in theirs), its own INFERSCALE_HOME, users made with the real ``users add``.

Each start is an engine start (~25 s on an idle 2-core machine), so the package shares two
servers, each started once (and again after a test kills it): ``one_process`` (api, edge,
inputs, isolation) and ``front``, ``--api-processes 2`` (edge, inputs, processes). Their tests
keep to their own users' memories, or to users of their own."""

from __future__ import annotations

import http.client
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import httpx
import pytest

START_TIMEOUT_S = 300.0
DEADLINE_SAYS = "is gone and this one has not shut down"  # lifetime.py, at its deadline
CONFIG = "k = 10\nrecompute = 0\nmax_tokens = 64\n"  # every hit injected: the tests check ids

# vLLM's running / waiting counts in the server's log every few seconds: what a failure shows.
ENGINE_STATS = {"INFERSCALE_VLLM_STATS": "1", "VLLM_LOGGING_LEVEL": "INFO"}


def free_port() -> int:
    """A loopback port free now, below the ephemeral range (32768 up on Linux): the kernel
    never hands it to a client's connection before the server binds it, and the pytest-xdist
    workers draw from ranges of their own."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    low = 20000 + 3000 * (worker % 4)
    for port in random.sample(range(low, low + 3000), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # all taken: any port the kernel gives
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    """Wait until ``base``/health answers; fail with the log's tail if ``proc`` exits or
    :data:`START_TIMEOUT_S` passes."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}):\n{_tail(log)}")
        try:
            if httpx.get(f"{base}/health", timeout=2).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"the server did not come up in {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


def idle_connection_still_served(port: int, idle_s: float) -> bool:
    """Whether a kept-alive connection to ``127.0.0.1:port`` still answers after ``idle_s``
    idle: two ``/health`` requests on one connection, the second sent after the pause."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        if not _health_kept_alive(conn):
            return False
        time.sleep(idle_s)
        return _health_kept_alive(conn)
    finally:
        conn.close()


def _health_kept_alive(conn: http.client.HTTPConnection) -> bool:
    """``GET /health`` on ``conn``, the response read whole (headers and body may come in
    separate segments): True if it is a 200 that keeps the connection open (else http.client
    would open a new one for the next request)."""
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):  # closed by the server meanwhile
        return False
    return response.status == 200 and not response.will_close


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


class Server:
    """One server home; :meth:`start` runs the command, :meth:`kill9` kills it hard."""

    def __init__(self, home: Path, api_processes: int = 1) -> None:
        self.home = home
        self.api_processes = api_processes
        self.port = free_port()
        self.log = home / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        config = home / "config" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(CONFIG)

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, INFERSCALE_HOME=str(self.home))

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def data(self) -> Path:
        return self.home / "data" / "serve"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def add_user(self, name: str) -> str:
        done = self.cli("users", "add", name)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app", "serve", "--port", str(self.port)]
                + ["--max-model-len", "2048", "--api-processes", str(self.api_processes)],
                env=dict(self.env, **ENGINE_STATS),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its engine processes in its own group
            )
        wait_healthy(self.proc, f"http://127.0.0.1:{self.port}", self.log)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        return _tail(self.log, chars)

    def group_alive(self) -> bool:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def group_members(self) -> list[str]:
        """``pid state cmdline`` of each live process in the server's process group."""
        assert self.proc is not None
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) != self.proc.pid:  # the process group id
                    continue
                cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")[:120]
                found.append(f"{stat.parent.name} {fields[0]} {cmd.decode(errors='replace')}")
            except (OSError, IndexError, ValueError):
                continue
        return found

    def kill9(self, wait_s: float = 120.0) -> float:
        """SIGKILL the server process alone; return how long its engine processes took to
        go by themselves (they watch their parent)."""
        assert self.proc is not None
        said_before = self.log.stat().st_size
        self.proc.kill()
        self.proc.wait()
        t0 = time.monotonic()
        while self.group_alive() and time.monotonic() - t0 < wait_s:
            time.sleep(0.2)
        gone = time.monotonic() - t0
        said = self.log.read_bytes()[said_before:].decode(errors="replace")
        if DEADLINE_SAYS in said:  # gone in time, but by the deadline: show where it hung
            warnings.warn(
                f"a shutdown hung; it was ended at its deadline:\n{said[-6000:]}", stacklevel=2
            )
        if self.group_alive():  # leave nothing behind for the next test, then fail
            left = self.group_members()
            os.killpg(self.proc.pid, signal.SIGKILL)
            pytest.fail(
                f"engine processes outlived a killed server by {wait_s:.0f} s: {left}"
                f"\nthe server's log:\n{_tail(self.log)}"
            )
        return gone

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class RuntimeDirServer(Server):
    """A server whose runtime dir (``XDG_RUNTIME_DIR``) is a short folder of its own: the API
    processes' sockets live there (their paths must fit), and a test can look at them."""

    def __init__(self, home: Path, api_processes: int = 1) -> None:
        super().__init__(home, api_processes)
        self.runtime = Path(tempfile.mkdtemp(prefix="xdg-"))  # short: sockets' paths fit

    @property
    def env(self) -> dict[str, str]:
        return dict(super().env, XDG_RUNTIME_DIR=str(self.runtime))

    def pids(self) -> list[int]:
        return [int(line.split()[0]) for line in self.group_members()]


# The shared servers' users. "fay" is the one the edge tests import an export for, and "ivy"
# never remembers anything (test_serve_inputs checks her export stays empty): the others'
# memories stay as the tests that use them expect (test_serve_processes counts them exactly,
# test_serve_isolation watches cy's requests in the engine).
SHARED_USERS = ("ana", "bo", "cy", "ed", "fay", "ivy")
STALE_UPLOAD = ".upload-left-by-a-crash"  # an unfinished upload of a server killed mid-write


def _shared(home: Path, api_processes: int):
    srv = RuntimeDirServer(home, api_processes)
    srv.tokens = {name: srv.add_user(name) for name in SHARED_USERS}  # type: ignore[attr-defined]
    # What a server killed mid-upload leaves: the first start removes it (test_serve_inputs).
    left = srv.data / "inbox" / "ana"
    for folder in (srv.data, left.parent, left):  # private, as the server makes its own
        folder.mkdir(exist_ok=True, mode=0o700)
    (left / STALE_UPLOAD).write_bytes(b"x" * 4096)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(srv.runtime, ignore_errors=True)


@pytest.fixture(scope="package")
def one_process(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path):
    """``serve`` in one process, shared by the package (see the module's docstring)."""
    yield from _shared(tmp_path_factory.mktemp("serve-one"), api_processes=1)


@pytest.fixture(scope="package")
def front(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path):
    """``serve --api-processes 2``, shared by the package: ana's requests go to process 0,
    bo's to process 1. A test that stops or kills it starts it again, or leaves it to the
    next user of the fixture: :func:`started`."""
    yield from _shared(tmp_path_factory.mktemp("serve-front"), api_processes=2)


def started(srv: Server) -> Server:
    """``srv``, started again if a test before stopped or killed it."""
    if not srv.running():
        srv.start()
    return srv
