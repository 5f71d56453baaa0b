"""The memory API: a user's facts over HTTP (list, remember, get, forget, search, import,
export). Every route runs on the user's memory thread (``Desk.run``) and sees the user's
profile only: another user's fact id is a 404, exactly like an id that does not exist."""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request, Response

from app.serve.deps import ApiError, DeskDep, not_found
from app.serve.hub import Desk
from app.serve.protocol import MemorySearch, NewMemory

if TYPE_CHECKING:
    from inferscale_core.types import Fact

FORGET_CAUSE = "forgotten through the API"
ADD_CAUSE = "added through the API"


def fact_json(fact: Fact) -> dict[str, Any]:
    return {
        "id": fact.id,
        "text": fact.text,
        "refers_to": fact.refers_to.isoformat() if fact.refers_to else None,
        "created_at": fact.created_at.isoformat(),
        "status": fact.status,
    }


def _own(desk: Desk, fact_id: int) -> Fact | None:
    """The user's active fact ``fact_id``, or None (another user's is None too)."""
    fact = desk.session.factlog.get_fact(fact_id)
    if fact is None or fact.profile_id != desk.session.profile_id or fact.status != "active":
        return None
    return fact


def add(app: FastAPI, inbox: Path | None) -> None:
    """Add the memory routes to ``app`` (``inbox``: where uploads are imported from)."""

    @app.get("/v1/memories")
    async def list_memories(
        desk: DeskDep,
        q: str = Query("", max_length=1000),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        def run() -> list[Fact]:
            return desk.session.factlog.search_facts(desk.session.profile_id, q, limit=limit)

        return {"object": "list", "data": [fact_json(f) for f in await desk.run(run)]}

    @app.post("/v1/memories", status_code=201)
    async def remember(body: NewMemory, desk: DeskDep) -> dict[str, Any]:
        try:
            fact = await desk.run(desk.session.remember, body.text, body.refers_to, ADD_CAUSE)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return fact_json(fact)

    @app.get("/v1/memories/export")
    async def export(desk: DeskDep) -> dict[str, Any]:
        def run() -> list[Fact]:
            return desk.session.factlog.active_facts(desk.session.profile_id)

        facts = await desk.run(run)
        return {
            "exported_at": datetime.now(UTC).isoformat(),
            "facts": [fact_json(f) for f in facts],
        }

    @app.get("/v1/memories/{fact_id}")
    async def get_memory(fact_id: int, desk: DeskDep) -> dict[str, Any]:
        fact = await desk.run(_own, desk, fact_id)
        if fact is None:
            raise not_found(f"no memory #{fact_id}")
        return fact_json(fact)

    @app.delete("/v1/memories/{fact_id}", status_code=204)
    async def forget(fact_id: int, desk: DeskDep) -> Response:
        def run() -> bool:
            if _own(desk, fact_id) is None:
                return False
            desk.session.forget(fact_id, FORGET_CAUSE)
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
                dict(fact_json(h.fact), score=round(h.score, 4), rank=h.rank)
                for h in sorted(hits, key=lambda h: h.rank)
            ]

        return {"object": "list", "data": await desk.run(run)}

    @app.post("/v1/memories/import")
    async def import_export(
        request: Request,
        desk: DeskDep,
        filename: str = Query("export.json", min_length=1, max_length=200),
    ) -> dict[str, Any]:
        data = await request.body()
        if not data:
            raise ApiError(400, "the body is empty: send the export file's bytes")
        report = await desk.run(_import, desk, data, filename, inbox)
        if report["status"] == "quarantined":
            raise ApiError(422, f"not imported: {report['reason']}")
        return report


def _import(desk: Desk, data: bytes, filename: str, inbox: Path | None) -> dict[str, Any]:
    """Write the upload into the user's inbox (mode 0600) and import it like a dropped file:
    imported files move to ``imported/``, bad ones to ``quarantine/`` with their reason."""
    from inferscale_core.importers.pipeline import Importer

    root = (inbox or Path(tempfile.gettempdir())) / desk.user.name
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = Path(filename).name or "export.json"
    fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=root)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    path = root / name
    counter = 1
    while path.exists():
        counter += 1
        path = root / f"{Path(name).stem} ({counter}){Path(name).suffix}"
    os.replace(tmp, path)
    session = desk.session
    report = Importer(session.factlog, session.profile_id, root).import_path(path)
    result = report.files[0]
    if session.worker is not None:
        session.worker.wake()  # extract and encode what arrived
    return {
        "status": result.status,
        "format": result.format,
        "conversations": result.conversations,
        "turns_added": result.turns_added,
        "reason": result.reason,
    }
