"""``bench import``: from dropping a chat export into the inbox until it is usable and encoded.

A seeded JSON Lines export (:func:`write_export`: two people over ``days`` days, one statement a
turn, each naming a person of its own, "My neighbour Ana Okafor keeps the red kayak in the
garage.") is dropped (renamed) into the inbox of a fresh home: the real
:class:`~inferscale_core.importers.watcher.InboxWatcher` imports it, the session's memory worker
(:func:`inferscale_core.wiring.open_session`) extracts, indexes and encodes it. Once per mode,
the same export, each mode in a fresh fact log and inbox (the entries a mode wrote are deleted
from the one engine's store before the next):

* ``eager``: ``kv_encode_recent_days = "all"``, every fact encoded (before issue 34);
* ``lazy``: the setting's default, facts of turns older than that before the last turn deferred
  until first retrieved.

Measured from the drop, by polling the fact log every ``poll`` seconds: ``imported_s`` (the
watcher's import done, the turns in the log), ``extracted_s`` (every turn extracted, its facts
indexed), ``usable_s`` (then every probe question, seeded about old and recent facts, finds its
fact among the top k of the session's retriever) and ``fully_encoded_s`` (no fact waits for
encoding except those deferred). At the end each probe is asked through the session (greedy,
``max_tokens`` tokens) and the reply's facts say how its fact went in (injected, recomputed,
text). Past ``limit`` seconds (``lazy_limit`` for lazy) a mode stops waiting: what it did not
reach is extrapolated from the rates measured so far, and the row says ``"extrapolated": true``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.report import provenance
from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.factlog import FactLog
from inferscale_core.importers.pipeline import Importer
from inferscale_core.importers.watcher import InboxWatcher


def _words(text: str) -> tuple[str, ...]:
    """The words of ``text``; an underscore joins two into one ("sewing machine")."""
    return tuple(word.replace("_", " ") for word in text.split())


MODES = ("eager", "lazy")
SPEAKERS = ("Maya", "Leo")
LAST_DAY = datetime(2026, 11, 30, 21, 0, tzinfo=UTC)
_FIRST = _words(
    "Ana Ben Carla Dmitri Elif Farid Greta Hugo Ines Jun Kofi Lena Mateo Nadia Omar Priya Quinn"
    " Rosa Sven Tariq Uma Viktor Wen Ximena Yusuf Zofia Aiko Bruno Chiara Dara Emeka Freya"
    " Goran Hana Ivo Jana Kai Lucia Milan Noor"
)
_ONSETS = _words("B D F G K L M N P R S T V Z Br Dr Kl St Tr Gr")
_NUCLEI = _words("a e i o u ai ei ou")
_CODAS = _words("rin lov nak dar sel mont berg vic ric tan los mir")
_ADJECTIVES = _words(
    "red blue green yellow old tiny heavy wooden silver antique folding spare broken velvet"
    " brass striped"
)
_THINGS = _words(
    "kayak lamp kettle violin telescope sewing_machine typewriter bicycle chess_set toolbox"
    " umbrella drone piano_stool rice_cooker sleeping_bag tent globe radio camera easel"
)
_PLACES = _words(
    "garage attic cellar garden_shed hallway closet boathouse spare_room loft pantry workshop"
    " greenhouse porch basement"
)
_RELATIONS = _words("neighbour cousin colleague aunt uncle friend landlord teacher")
_TEMPLATES = (
    "My {relation} {name} keeps the {thing} in the {place}.",
    "I found out that {name}, my {relation}, keeps the {thing} in the {place}.",
    "Did you know my {relation} {name} keeps the {thing} in the {place} now.",
    "{name} told me she keeps the {thing} in the {place} since the move.",
)


@dataclass(frozen=True, slots=True)
class Statement:
    """One turn of the export and what a probe asks about it."""

    when: str  # ISO 8601
    speaker: str
    text: str
    name: str  # unique to this turn: the probe's fact is the one naming it
    question: str
    recent: bool  # within encode_recent_days of the last turn (encoded at import when lazy)


def statements(turns: int, days: int, recent_days: int, seed: int = 0) -> list[Statement]:
    """``turns`` seeded statements, oldest first, over ``days`` days ending at LAST_DAY; each
    names a person no other turn names."""
    rng = random.Random(seed)
    surnames = [o + n + c for o in _ONSETS for n in _NUCLEI for c in _CODAS]
    names = [f"{first} {last}" for first in _FIRST for last in surnames]
    if turns > len(names):
        raise ValueError(f"at most {len(names)} turns")
    chosen = rng.sample(names, turns)
    start = LAST_DAY - timedelta(days=days)
    offsets = sorted(rng.uniform(0, days * 86400) for _ in range(turns - 1)) + [days * 86400]
    out = []
    for i, (name, offset) in enumerate(zip(chosen, offsets, strict=True)):
        when = start + timedelta(seconds=round(offset))
        thing = f"{rng.choice(_ADJECTIVES)} {rng.choice(_THINGS)}"
        text = rng.choice(_TEMPLATES).format(
            relation=rng.choice(_RELATIONS), name=name, thing=thing, place=rng.choice(_PLACES)
        )
        out.append(
            Statement(
                when.isoformat().replace("+00:00", "Z"),
                SPEAKERS[i % 2],
                text,
                name,
                f"Where does {name} keep the {thing}?",
                LAST_DAY - when <= timedelta(days=recent_days),
            )
        )
    return out


def write_export(path: Path, said: Sequence[Statement]) -> Path:
    """The statements as a JSON Lines chat log (``inferscale_core/importers/jsonl.py``)."""
    rows = (
        {"speaker": s.speaker, "text": s.text, "timestamp": s.when, "conversation_id": "chat"}
        for s in said
    )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def choose_probes(said: Sequence[Statement], count: int, seed: int = 0) -> list[Statement]:
    """Half about recent turns, half about old ones (as many as there are), seeded."""
    rng = random.Random(seed + 1)
    recent = [s for s in said if s.recent]
    old = [s for s in said if not s.recent]
    half = min(len(recent), count // 2)
    return rng.sample(recent, half) + rng.sample(old, min(len(old), count - half))


def run_import(
    assistant: wiring.Assistant,
    config: AppConfig,
    work_dir: Path,
    *,
    turns: int = 10_000,
    days: int = 1095,
    probes: int = 20,
    limit: float = 300.0,
    lazy_limit: float = 1800.0,
    modes: Sequence[str] = MODES,
    max_tokens: int = 16,
    poll: float = 0.5,
    seed: int = 0,
    embedder: Any = None,
    model_name: str = "",
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Both modes on one export in ``work_dir`` (see the module); JSON-ready."""
    from inferscale_core.embedder import SentenceTransformerEmbedder

    recent_days = AppConfig().kv_encode_recent_days
    if config.encode_recent_days is not None:
        recent_days = config.encode_recent_days
    said = statements(turns, days, recent_days, seed)
    export = write_export(Path(work_dir) / "export.jsonl", said)
    asked = choose_probes(said, probes, seed)
    embedder = embedder or SentenceTransformerEmbedder()
    rows = []
    for mode in modes:
        days_setting: int | str = "all" if mode == "eager" else recent_days
        mode_config = AppConfig(**{**config.to_dict(), "kv_encode_recent_days": days_setting})
        rows.append(
            _run_mode(
                assistant,
                mode_config,
                mode,
                export,
                Path(work_dir) / mode,
                said,
                asked,
                limit=limit if mode == "eager" else lazy_limit,
                max_tokens=max_tokens,
                poll=poll,
                embedder=embedder,
                on_progress=on_progress,
            )
        )
    settings = {"turns": turns, "days": days, "probes": len(asked), "limit_s": limit}
    settings["lazy_limit_s"] = lazy_limit
    settings |= {"seed": seed, "recent_days": recent_days, "k": config.k, "w": config.w}
    settings |= {"window": config.window, "kv_store_dtype": assistant.store.store_dtype}
    return {
        **provenance("import", model_name, command),
        "settings": settings,
        "export": {
            "format": "jsonl",
            "bytes": export.stat().st_size,
            "speakers": SPEAKERS,
            "recent_turns": sum(s.recent for s in said),
        },
        "rows": rows,
    }


def _run_mode(
    assistant: wiring.Assistant,
    config: AppConfig,
    mode: str,
    export: Path,
    home: Path,
    said: Sequence[Statement],
    asked: Sequence[Statement],
    *,
    limit: float,
    max_tokens: int,
    poll: float,
    embedder: Any,
    on_progress: Callable[[str], None],
) -> dict[str, Any]:
    home.mkdir(parents=True)
    db, inbox = home / "memory.db", home / "inbox"
    settings = wiring.session_settings(config, assistant.model_dir)
    session = wiring.open_session(
        assistant,
        config,
        db,
        embedder=embedder,
        session_config=replace(settings, max_tokens=max_tokens),
    )
    worker, log, pid = session.worker, session.factlog, session.profile_id
    assert worker is not None
    imported = threading.Event()

    def importer() -> Importer:  # as the app's: its own connection, on the watcher's thread
        own = FactLog.open(db)
        return Importer(own, own.profile(config.profile), inbox)

    def done(result: Any) -> None:
        if result.status == "imported":
            imported.set()
            worker.wake()  # the app wakes its worker on an import (app/tui/inbox.py)

    marks: dict[str, float | None] = dict.fromkeys(
        ("imported_s", "extracted_s", "usable_s", "fully_encoded_s")
    )
    watcher = InboxWatcher(inbox, importer, 1.0, 0.25, on_result=done)
    watcher.start()
    dropped = shutil.copy(export, home / export.name)  # then renamed in: a finished download
    t0 = time.perf_counter()
    os.replace(dropped, inbox / export.name)
    first = last = None
    found: list[bool] = []
    extracted = encoded = 0
    try:
        while (elapsed := time.perf_counter() - t0) < limit:
            if marks["imported_s"] is None:
                if imported.is_set():
                    marks["imported_s"] = elapsed
                    ids = [turn_id for turn_id, _ in log.turns(pid)]
                    first, last = ids[0], ids[-1]
                time.sleep(poll / 5)
                continue
            cursor = log.extraction_cursor(pid)
            extracted = max(0, cursor - first + 1)
            if marks["extracted_s"] is None and cursor >= last:
                marks["extracted_s"] = elapsed
            if marks["extracted_s"] is not None and marks["usable_s"] is None:
                found = _retrievable(session, asked)
                if all(found):
                    marks["usable_s"] = elapsed
            pending = log.facts_without_kv(
                pid, assistant.fingerprint, session.config.w, session.encoding, limit=1
            )
            if marks["extracted_s"] is not None and not pending:
                marks["fully_encoded_s"] = elapsed
                if marks["usable_s"] is not None or not all(found):
                    break
            encoded = worker.stats.encoded_facts
            on_progress(
                f"{mode}: {elapsed:.0f} s, {extracted}/{len(said)} turns extracted,"
                f" {encoded} facts encoded, {worker.stats.deferred} deferred"
            )
            time.sleep(poll)
        watcher.stop()
        wall = time.perf_counter() - t0
        worker.stop(timeout=None)  # an encode batch in flight finishes first
        encoded = worker.stats.encoded_facts
        row = _summary(mode, config, session, assistant, said, marks, wall, extracted, encoded)
        on_progress(f"{mode}: asking the {len(asked)} probe questions")
        row["probes"] = _ask(session, asked, found)
        row["probes_answered_from_memory"] = sum(p["used"] is not None for p in row["probes"])
    finally:
        watcher.stop()
        keys = _recorded_keys(log, pid, assistant.fingerprint)
        session.close()
        for key in keys:  # the next mode starts from an empty store
            assistant.store.delete(key)
    return row


def _retrievable(session: Any, asked: Sequence[Statement]) -> list[bool]:
    """Whether each probe's fact is among the session's top k for its question (read only:
    a reply would also queue the deferred facts it retrieves for encoding)."""
    session.sync_changes()
    k = session.config.k
    return [
        any(
            p.name in hit.fact.text
            for hit in session.retriever.search(session.profile_id, p.question, k)
        )
        for p in asked
    ]


def _ask(session: Any, asked: Sequence[Statement], found: list[bool]) -> list[dict[str, Any]]:
    out = []
    for i, probe in enumerate(asked):
        reply = session.ask_all(None, probe.question, log=False)
        used = [f for f in reply.facts if probe.name in f.text]
        out.append(
            {
                "question": probe.question,
                "said": probe.when,
                "recent": probe.recent,
                "retrieved_at_usable": found[i] if i < len(found) else None,
                "used": used[0].how if used else None,
                "answer": reply.text.strip(),
            }
        )
    return out


def _recorded_keys(log: FactLog, pid: int, fingerprint: str) -> list[str]:
    ids = [fact.id for fact in log.active_facts(pid)]
    keys: list[str] = []
    for fact_id in ids:
        keys.extend(k for m, k in log.kv_keys_by_model(fact_id) if m == fingerprint)
    return keys


def _summary(
    mode: str,
    config: AppConfig,
    session: Any,
    assistant: wiring.Assistant,
    said: Sequence[Statement],
    marks: dict[str, float | None],
    wall: float,
    extracted: int,
    encoded: int,
) -> dict[str, Any]:
    log, pid, worker = session.factlog, session.profile_id, session.worker
    facts = len(log.active_facts(pid))
    deferred = sum(log.deferred_kv(pid).values())
    keys = _recorded_keys(log, pid, assistant.fingerprint)
    disk = sum(assistant.store.path(key).stat().st_size for key in keys)
    row: dict[str, Any] = {
        "mode": mode,
        "kv_encode_recent_days": config.kv_encode_recent_days,
        # the same rounding for every mark keeps their order (imported <= ... <= wall)
        **{name: None if at is None else round(at, 2) for name, at in marks.items()},
        "wall_s": round(wall, 2),
        "turns": len(said),
        "turns_extracted": extracted,
        "facts": facts,
        "deferred": deferred,
        "encoded": len(keys),
        "kv_disk_bytes": disk,
        "kv_bytes_per_fact": round(disk / len(keys)) if keys else None,
        "encode_rate_facts_per_s": round(worker.stats.encode_rate, 3),
        "evicted": worker.stats.evicted,
        "worker_errors": worker.stats.errors,
        "extrapolated": False,
    }
    if marks["fully_encoded_s"] is None:  # the limit came first: extrapolate
        row.update(_extrapolate(row, marks, said, wall, encoded))
    return row


def _extrapolate(
    row: dict[str, Any],
    marks: dict[str, float | None],
    said: Sequence[Statement],
    wall: float,
    encoded: int,
) -> dict[str, Any]:
    """Linear in what was measured. The worker extracts every pending turn before it encodes
    (memory_worker's loop), so: turns extracted per second of wall time since the import until
    extraction ends, then the facts left at the rate encoding kept in wall time since then (the
    rate of its batches alone, ``encode_rate_facts_per_s``, leaves out the fact log's work
    between batches: 44 against 28 facts/s on an H100), or, when extraction had not ended, at
    the rate of its batches."""
    imported = marks["imported_s"] or 0.0
    extracted = row["turns_extracted"]
    per_turn = row["facts"] / extracted if extracted else 1.0
    to_encode = per_turn * (len(said) if row["mode"] == "eager" else sum(s.recent for s in said))
    out: dict[str, Any] = {"extrapolated": True, "facts_projected": round(per_turn * len(said))}
    spent = max(wall - imported, 1e-9)
    ended = marks["extracted_s"]
    usable = marks["usable_s"] or ended
    if usable is None:
        if not extracted:
            return out
        usable = imported + len(said) * spent / extracted
        out["usable_s"] = round(usable, 1)
    left = max(0.0, to_encode - encoded)
    if ended is not None and wall > ended and encoded:
        out["fully_encoded_s"] = round(wall + left / (encoded / (wall - ended)), 1)
    elif (rate := row["encode_rate_facts_per_s"]) > 0:
        out["fully_encoded_s"] = round(max(usable, wall) + left / rate, 1)
    return out


def headline(result: dict[str, Any]) -> str:
    parts = []
    for row in result["rows"]:
        guessed = row["extrapolated"]
        usable = duration(row["usable_s"], usable_extrapolated(row))
        parts.append(
            f"{row['mode']}: usable {usable},"
            f" fully encoded {duration(row['fully_encoded_s'], guessed)},"
            f" {row['deferred']} deferred, {row['kv_disk_bytes'] / 1e6:.0f} MB"
        )
    turns = result["settings"]["turns"]
    return f"import of {turns:,} turns: " + "; ".join(parts)


def usable_extrapolated(row: dict[str, Any]) -> bool:
    """Whether the row's ``usable_s`` is extrapolated (extraction did not end in time)."""
    return row["extrapolated"] and row["extracted_s"] is None


def duration(seconds: float | None, extrapolated: bool = False) -> str:
    """``42 s``, ``3.5 min``; ``~`` before an extrapolated time, ``-`` for none."""
    if seconds is None:
        return "-"
    shown = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    return f"~{shown}" if extrapolated else shown
