"""The desk behind a private Unix socket: one resident engine and memory for every door.

While the app (or ``inferscale-assistant daemon``) runs, :class:`DeskServer` serves its
:class:`~inferscale_core.desk.Desk` on a socket in the user's runtime folder; ``ask``, ``memory``,
``import`` and the MCP server reach it through :class:`RemoteDesk`, which has the desk's plain-data
methods, instead of starting an engine of their own.

Private: the folder is 0700, the socket 0600, and each connection's peer is checked with
``SO_PEERCRED``: another user's process is refused before it sends a byte.

The wire: one JSON object per line. A call is ``{"method", "params"}``; its answer is
``{"result": ...}`` or ``{"error": {"type", "message"}}``; :meth:`Desk.ask_plain` answers with
``{"delta": "..."}`` lines first and its :func:`~inferscale_core.desk.reply_json` last. One call
at a time per connection; a client hanging up mid-reply stops the reply (the engine aborts it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_core import paths
from inferscale_core.composer import TurnRejected
from inferscale_core.desk import SessionNotReadyError

if TYPE_CHECKING:
    from inferscale_core.desk import Desk

PROTOCOL = 1
MAX_LINE = 16 << 20  # bytes of one message (a search's or an import's answer)
CONNECT_TIMEOUT_S = 2.0

#: What the wire's error types raise on the client's side.
ERRORS: dict[str, type[Exception]] = {
    "TurnRejected": TurnRejected,
    "SessionNotReadyError": SessionNotReadyError,
    "ValueError": ValueError,
    "LookupError": LookupError,
    "PermissionError": PermissionError,
}


class RemoteDeskError(RuntimeError):
    """The resident desk failed a call in a way the client has no type for, or went away."""


class DeskBusyError(RuntimeError):
    """Another process already serves this memory's desk."""


def socket_path(db_path: Path, profile: str) -> Path:
    """The socket of the desk of ``db_path``'s ``profile``, in the private runtime folder.

    Named by a hash of both (a profile name may hold any character; a socket path is at most
    107 bytes), so two memories on one machine never share a socket."""
    key = f"{Path(db_path).resolve()}\0{profile}".encode()
    return paths.runtime_dir() / f"desk-{hashlib.sha256(key).hexdigest()[:16]}.sock"


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (Linux)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _send(stream: Any, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")
    stream.flush()


def _receive(stream: Any) -> dict[str, Any] | None:
    """The next message, or None at the end of the stream."""
    line = stream.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise ValueError(f"a message longer than {MAX_LINE} bytes")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def _error(exc: BaseException) -> dict[str, Any]:
    kind = next((name for name, t in ERRORS.items() if type(exc) is t), None)
    if kind is None:
        kind = next((name for name, t in ERRORS.items() if isinstance(exc, t)), "RuntimeError")
    return {"error": {"type": kind, "message": str(exc) or type(exc).__name__}}


class _Gone(Exception):
    """The client hung up."""


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        uid = peer_uid(self.connection)
        with contextlib.suppress(_Gone):
            if uid != os.getuid():
                self._send(_error(PermissionError(f"uid {uid} may not use this memory")))
                return
            while (message := self._next()) is not None:
                self._answer(message)

    def _send(self, message: dict[str, Any]) -> None:
        try:
            _send(self.wfile, message)
        except OSError as exc:
            raise _Gone from exc

    def _next(self) -> dict[str, Any] | None:
        try:
            return _receive(self.rfile)
        except OSError:
            return None
        except ValueError as exc:
            self._send(_error(ValueError(f"not a call: {exc}")))
            return None

    def _answer(self, message: dict[str, Any]) -> None:
        """Answer one call (raises _Gone once the client is gone)."""
        method, params = message.get("method"), message.get("params") or {}
        call = self.server.methods.get(method) if isinstance(method, str) else None
        try:
            if call is None:
                raise LookupError(f"no method {method!r}")
            if not isinstance(params, dict):
                raise ValueError("params must be an object")
            if method == "ask":
                answer = {"result": self._stream(params)}
            else:
                answer = {"result": call(**params)}
        except _Gone:
            raise
        except TypeError as exc:  # the wrong arguments for the method
            answer = _error(ValueError(str(exc)))
        except Exception as exc:  # the call failed: the client is told why
            answer = _error(exc)
        self._send(answer)

    def _stream(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """Send the reply's deltas; return its plain form (raises _Gone: the reply stopped)."""
        facts = params.pop("facts", None)
        if facts is not None:
            params["facts"] = [(text, day) for text, day in facts]
        replies = self.server.desk.ask_plain(**params)
        try:
            for item in replies:
                if isinstance(item, dict):
                    return item
                self._send({"delta": item})
        finally:
            replies.close()  # the client hung up: the engine aborts the reply
        return None


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    desk: Desk
    methods: dict[str, Callable[..., Any]]


class DeskServer:
    """Serves ``desk`` on its socket (:func:`socket_path`) from a thread, until :meth:`close`.

    Args:
        desk: the desk.
        path: the socket (default: the desk's own).

    Raises:
        DeskBusyError: another process serves that socket now (a stale one is replaced).
    """

    def __init__(self, desk: Desk, path: Path | None = None) -> None:
        self.path = path or socket_path(desk.db_path, desk.profile)
        paths.private_dir(self.path.parent)
        if probe(self.path):
            raise DeskBusyError(f"another assistant serves this memory at {self.path}")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by a process that was killed
        old = os.umask(0o177)  # the socket is 0600 from its first moment
        try:
            self._server = _Server(str(self.path), _Handler)
        finally:
            os.umask(old)
        self._server.desk = desk
        self._server.methods = {
            "hello": lambda: {"protocol": PROTOCOL, "pid": os.getpid(), "ready": desk.ready},
            "conversation": desk.conversation,
            "recent_conversations": desk.recent_conversations,
            "search": desk.search,
            "add_fact": desk.add_fact,
            "forget": desk.forget,
            "ask": desk.ask_plain,
            "wake": desk.wake,
            "wait_remembered": desk.wait_remembered,
        }
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="desk-socket", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket (repeatable)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def probe(path: Path) -> bool:
    """Whether a desk answers at ``path`` now."""
    try:
        with RemoteDesk(path) as remote:
            remote.hello()
        return True
    except (OSError, RemoteDeskError, ValueError):
        return False


class RemoteDesk:
    """The desk of another process, through its socket: the desk's plain-data methods.

    Args:
        path: the socket.

    Raises:
        OSError: nothing listens there (ConnectionRefusedError, FileNotFoundError).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            self._sock.connect(str(path))
            if peer_uid(self._sock) != os.getuid():  # only this user's own process
                raise PermissionError(f"{path} is served by another user")
        except OSError:
            self._sock.close()
            raise
        self._sock.settimeout(None)  # a reply or an import takes what it takes
        self._stream = self._sock.makefile("rwb")
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, db_path: Path, profile: str) -> RemoteDesk | None:
        """The resident desk of that memory, or None when no process serves it."""
        try:
            return cls(socket_path(db_path, profile))
        except OSError:
            return None

    def __enter__(self) -> RemoteDesk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.close()
        self._sock.close()

    def _read(self, raise_error: bool = True) -> dict[str, Any]:
        try:
            message = _receive(self._stream)
        except (OSError, ValueError) as exc:
            raise RemoteDeskError(f"the resident assistant's answer broke off: {exc}") from exc
        if message is None:
            raise RemoteDeskError("the resident assistant closed the connection")
        if raise_error:
            self._raise(message)
        return message

    @staticmethod
    def _raise(message: dict[str, Any]) -> None:
        """Raise the error a message carries, as its type on this side."""
        error = message.get("error")
        if error is not None:
            kind = ERRORS.get(error.get("type"), RemoteDeskError)
            raise kind(error.get("message", "failed"))

    def call(self, method: str, **params: Any) -> Any:
        """Call ``method`` on the desk and return its result (its error raised here)."""
        with self._lock:
            try:
                _send(self._stream, {"method": method, "params": params})
            except (OSError, ValueError) as exc:  # ValueError: this side closed it
                raise RemoteDeskError(f"the resident assistant is gone: {exc}") from exc
            return self._read()["result"]

    def hello(self) -> dict[str, Any]:
        """``{"protocol", "pid", "ready"}`` of the serving process."""
        return self.call("hello")

    def conversation(self, source: str, title: str | None = None) -> int:
        return self.call("conversation", source=source, title=title)

    def recent_conversations(self, limit: int = 20) -> list[dict[str, Any]]:
        return self.call("recent_conversations", limit=limit)

    def search(self, query: str, k: int | None = None) -> list[dict[str, Any]]:
        return self.call("search", query=query, k=k)

    def add_fact(self, text: str, refers_to: str | None = None) -> dict[str, Any]:
        return self.call("add_fact", text=text, refers_to=refers_to)

    def forget(self, fact_id: int, cause: str | None = None) -> bool:
        """Forget the profile's active fact (False: it has none); ``cause`` goes in its
        history (None: the desk's own words)."""
        if cause is None:
            return self.call("forget", fact_id=fact_id)
        return self.call("forget", fact_id=fact_id, cause=cause)

    def wake(self) -> None:
        self.call("wake")

    def wait_remembered(self, turn_ids: list[int], timeout_s: float) -> bool:
        return self.call("wait_remembered", turn_ids=list(turn_ids), timeout_s=timeout_s)

    def ask_plain(self, question: str, **options: Any) -> Iterator[str | dict[str, Any]]:
        """Stream the reply's text deltas (str), then its ``reply_json`` (dict) last.

        Args:
            question: the user's message.
            options: :meth:`Desk.ask`'s (``conversation_id``, ``log``, ``facts`` as
                ``[text, ISO day or None]`` pairs, ``k``, ``mode``, ``recompute``,
                ``max_tokens``).
        """
        with self._lock:
            try:
                _send(self._stream, {"method": "ask", "params": {"question": question, **options}})
            except (OSError, ValueError) as exc:  # ValueError: this side closed it
                raise RemoteDeskError(f"the resident assistant is gone: {exc}") from exc
            finished = False
            try:
                while True:
                    message = self._read(raise_error=False)
                    if "delta" in message:
                        yield message["delta"]
                        continue
                    finished = True
                    self._raise(message)
                    yield message["result"]
                    return
            finally:
                if not finished:  # stopped early: hanging up stops the reply there
                    self.close()
