"""The memory API: a user's facts over HTTP (list, remember, get, forget, search, import,
export). Every route runs on the user's memory thread (``Desk.run``) and sees the user's
profile only: another user's fact id is a 404, exactly like an id that does not exist.

What a client sends is checked here, before it reaches SQLite, the tokenizer or a file system:
an id out of SQLite's range is a 404 like any unknown id, text with a NUL or a lone surrogate
is a 400 (``protocol.check_text``), and an upload's file name must be one short, plain name.
Uploads are kept in the user's inbox (imported and quarantined files alike) up to a quota.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query, Request, Response
from pydantic import AfterValidator

from app.serve.deps import ApiError, DeskDep, not_found
from app.serve.hub import Desk
from app.serve.protocol import MemorySearch, NewMemory, check_text
from inferscale_core.desk import fact_json

if TYPE_CHECKING:
    from inferscale_core.types import Fact

log = logging.getLogger(__name__)

FORGET_CAUSE = "forgotten through the API"
ADD_CAUSE = "added through the API"
MAX_FACT_ID = (1 << 63) - 1  # SQLite's largest integer: a larger id is no fact's
# What a user's uploads may take in their inbox (imported and quarantined files): past it an
# upload is refused (413), and nothing kept is deleted to make room.
INBOX_QUOTA_BYTES = 256 << 20
# An upload's name, in UTF-8 bytes: with " (n)" and ".reason.txt" added it stays under the
# 255 bytes a file name may have.
MAX_NAME_BYTES = 200
UPLOAD_PREFIX = ".upload-"  # an upload being written; one left from a crash is removed at start


def _own(desk: Desk, public_id: int) -> Fact | None:
    """The user's active fact of the API's id ``public_id``, or None (another user's is None
    too: their ids map to other facts, or to none)."""
    fact_id = desk.ids.private(public_id)
    if fact_id is None:
        return None
    fact = desk.session.factlog.get_fact(fact_id)
    if fact is None or fact.profile_id != desk.session.profile_id or fact.status != "active":
        return None
    return fact


def add(app: FastAPI, inbox: Path | None, quota_bytes: int = INBOX_QUOTA_BYTES) -> None:
    """Add the memory routes to ``app`` (``inbox``: where uploads are imported from, each
    user's up to ``quota_bytes``). Unfinished uploads left in ``inbox`` are removed."""
    if inbox is not None:
        _sweep_uploads(inbox)

    @app.get("/v1/memories")
    async def list_memories(
        desk: DeskDep,
        q: Annotated[str, Query(max_length=1000), AfterValidator(check_text)] = "",
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> dict[str, Any]:
        def run() -> list[Fact]:
            return desk.session.factlog.search_facts(desk.session.profile_id, q, limit=limit)

        return {
            "object": "list",
            "data": [fact_json(f, desk.ids.public) for f in await desk.run(run)],
        }

    @app.post("/v1/memories", status_code=201)
    async def remember(body: NewMemory, desk: DeskDep) -> dict[str, Any]:
        try:
            fact = await desk.run(desk.session.remember, body.text, body.refers_to, ADD_CAUSE)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return fact_json(fact, desk.ids.public)

    @app.get("/v1/memories/export")
    async def export(desk: DeskDep) -> dict[str, Any]:
        def run() -> list[Fact]:
            return desk.session.factlog.active_facts(desk.session.profile_id)

        facts = await desk.run(run)
        return {
            "exported_at": datetime.now(UTC).isoformat(),
            "facts": [fact_json(f, desk.ids.public) for f in facts],
        }

    @app.get("/v1/memories/{fact_id}")
    async def get_memory(fact_id: int, desk: DeskDep) -> dict[str, Any]:
        fact = await desk.run(_own, desk, fact_id) if 0 < fact_id <= MAX_FACT_ID else None
        if fact is None:
            raise not_found(f"no memory #{fact_id}")
        return fact_json(fact, desk.ids.public)

    @app.delete("/v1/memories/{fact_id}", status_code=204)
    async def forget(fact_id: int, desk: DeskDep) -> Response:
        def run() -> bool:
            if not 0 < fact_id <= MAX_FACT_ID or _own(desk, fact_id) is None:
                return False
            desk.session.forget(desk.ids.private(fact_id), FORGET_CAUSE)
            return True

        if not await desk.run(run):
            raise not_found(f"no memory #{fact_id}")
        return Response(status_code=204)

    @app.post("/v1/memories/search")
    async def search(body: MemorySearch, desk: DeskDep) -> dict[str, Any]:
        def run() -> list[dict[str, Any]]:
            session = desk.session
            session.sync_changes()
            k = session.config.k if body.k is None else body.k
            hits = session.retriever.search(session.profile_id, body.query, k)
            return [
                dict(fact_json(h.fact, desk.ids.public), score=round(h.score, 4), rank=h.rank)
                for h in sorted(hits, key=lambda h: h.rank)
            ]

        return {"object": "list", "data": await desk.run(run)}

    @app.post("/v1/memories/import")
    async def import_export(
        request: Request,
        desk: DeskDep,
        filename: str = Query("export.json", min_length=1, max_length=200),
    ) -> dict[str, Any]:
        name = upload_name(filename)
        root = (inbox or Path(tempfile.gettempdir())) / desk.user.name
        declared = request.headers.get("content-length", "")
        if declared.isdigit():  # refused before the body is read
            await desk.run(_check_quota, root, int(declared), quota_bytes)
        data = await request.body()
        if not data:
            raise ApiError(400, "the body is empty: send the export file's bytes")
        report = await desk.run(_import, desk, root, data, name, quota_bytes)
        if report["status"] == "quarantined":
            raise ApiError(422, f"not imported: {report['reason']}")
        return report


def upload_name(filename: str) -> str:
    """``filename`` if it can name an upload in the inbox: one plain name (no folder, not
    hidden, no control character) of at most :data:`MAX_NAME_BYTES`; else a 400 saying why."""
    if "/" in filename or "\\" in filename or filename in (".", ".."):
        problem = "is a path: send the file's name only, without folders"
    elif any(ord(c) < 32 or ord(c) == 127 for c in filename):
        problem = "has a control character (such as NUL or a newline)"
    elif filename.startswith("."):
        problem = "starts with '.' (a hidden file)"
    else:
        try:
            check_text(filename)
        except ValueError as exc:
            problem = str(exc)
        else:
            if len(filename.encode("utf-8")) <= MAX_NAME_BYTES:
                return filename
            problem = f"is longer than {MAX_NAME_BYTES} bytes (UTF-8)"
    raise ApiError(400, f"filename {problem}")


def _sweep_uploads(inbox: Path) -> None:
    """Remove uploads a stopped server left half written (``<inbox>/<user>/.upload-*``)."""
    removed = 0
    for stale in inbox.glob(f"*/{UPLOAD_PREFIX}*"):
        with contextlib.suppress(FileNotFoundError):  # another API process removed it
            stale.unlink()
            removed += 1
    if removed:
        log.info("removed %d unfinished upload(s) from the inbox", removed)


def _stored_bytes(root: Path) -> int:
    """The bytes of every file under ``root`` (a user's inbox: uploads, imported/, quarantine/)."""
    total = 0
    for folder, _, files in os.walk(root):
        for file in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(folder, file)).st_size
    return total


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _check_quota(root: Path, size: int, quota: int) -> None:
    """A 413 unless an upload of ``size`` bytes fits in the user's inbox quota."""
    used = _stored_bytes(root)
    if used + size > quota:
        raise ApiError(
            413,
            f"this upload ({_mib(size)}) does not fit in your inbox's quota: your earlier"
            f" uploads (imported and quarantined files, which the server keeps) take"
            f" {_mib(used)} of {_mib(quota)}. Nothing was deleted to make room; the server's"
            " admin can remove old files from your inbox.",
        )


def _import(desk: Desk, root: Path, data: bytes, name: str, quota: int) -> dict[str, Any]:
    """Write the upload into the user's inbox (mode 0600) and import it like a dropped file:
    imported files move to ``imported/``, bad ones to ``quarantine/`` with their reason. An
    upload that fails on the way leaves no file behind."""
    _check_quota(root, len(data), quota)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=UPLOAD_PREFIX, dir=root)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        path = root / name
        counter = 1
        while path.exists():
            counter += 1
            path = root / f"{Path(name).stem} ({counter}){Path(name).suffix}"
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:
        report = desk.import_path(path, root)  # and wakes the memory worker
    finally:
        if path.exists():  # not filed away: the import failed (not the file's fault)
            path.unlink()
    result = report.files[0]
    return {
        "status": result.status,
        "format": result.format,
        "conversations": result.conversations,
        "turns_added": result.turns_added,
        "reason": _without_paths(result.reason, path, root, name),
    }


def _without_paths(reason: str | None, path: Path, root: Path, name: str) -> str | None:
    """``reason`` as the client may read it: the file's name instead of its path on the
    server, and no other server path."""
    if reason is None:
        return None
    for where in {str(path.resolve()), str(path)}:
        reason = reason.replace(where, name)
    for where in {str(root.resolve()), str(root)}:
        reason = reason.replace(where, "the inbox")
    return reason
