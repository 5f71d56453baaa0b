"""The import pipeline: export files (or a folder of them) into the fact log.

Per file: sha256 of the bytes (streamed) → skip if that hash is recorded as imported →
:func:`~inferscale_core.importers.parse_file` → :meth:`FactLog.add_conversation` for each
conversation as it is parsed (one transaction each) → a row in ``imports`` → for a file that
sits directly in the inbox, a move to ``inbox/imported/`` or ``inbox/quarantine/``.

Decisions:

* **Crash safety** comes from the fact log: a conversation is stored whole or not at all, and
  the file's ``imports`` row is written only after its last conversation, so after a crash the
  file is parsed again and :meth:`FactLog.add_conversation` adds only what is missing.
* **Conversation identity.** ChatGPT, Claude and LoCoMo conversations carry ids that are
  unique beyond the file, and are stored under them. The others are resolved here: WhatsApp,
  Markdown and ungrouped JSON Lines conversations have no id, and JSON Lines group ids
  (``"conversation_id": "1"``) are only unique within their file. Such a conversation is
  stored under its id, or ``auto:<sha256 of its first turn>`` when it has none, provided the
  conversation already stored under that key agrees turn by turn with the one being imported
  (on the turns both have); otherwise under ``<key>~2``, ``<key>~3``, … So a grown export
  (same first turns, more at the end) adds only its new turns whatever its name or hash, a
  renamed copy adds nothing, and two different chats that happen to share an id or a first
  turn stay apart. A file hash in the key (``<hash>/<index>``) would make a grown file a new
  conversation, re-adding every turn. Cost: one read of the stored turns per such
  conversation. Limit: if a stored turn changed in a newer export (an edited message), the
  newer export becomes a separate conversation. Looking the key up and adding the conversation
  run in one :meth:`FactLog.transaction`, so no other writer can take the key in between.
* **Bad files** (:class:`UnsupportedExportError`, :class:`MalformedExportError`,
  ``UnicodeError``, ``OSError``) are reported with a reason for the person importing them: what
  is wrong with the file and what to do (:func:`quarantine_reason`), and the batch goes on.
  Conversations parsed before a malformed spot stay stored (they are valid); fixing the file
  and importing it again adds the rest. Any other exception (a full disk, a
  parser bug) stops the batch: it is not the file's fault, so the file is not quarantined.
* **Memory exports** (``memories``: our own ``memory export``) hold facts, not conversations:
  they are checked whole (:func:`~inferscale_core.importers.memories.parse_facts`), then added
  in one transaction with :meth:`FactLog.add_fact` (one active fact per text in a profile), so
  a second import adds nothing and a damaged one adds nothing and is quarantined.
* **Moves**: only files directly in ``inbox_root``; a file given by a path elsewhere is never
  moved. A file that changed while it was imported stays in the inbox, so its new content is
  picked up next time. Name clashes in the target folder get `` (2)``, `` (3)``, … suffixes.
* A folder is read one level deep (no recursion), dotfiles and partial downloads left out,
  oldest modification time first, then by name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from inferscale_core.factlog import FactLog
from inferscale_core.importers import (
    MalformedExportError,
    UnsupportedExportError,
    detect_format,
    memories,
    parse_file,
)
from inferscale_core.types import Conversation, Turn

logger = logging.getLogger(__name__)

IMPORTED_DIR = "imported"
QUARANTINE_DIR = "quarantine"
REASON_SUFFIX = ".reason.txt"
#: Names of files still being downloaded or written; never imported from a folder.
PARTIAL_SUFFIXES = (".part", ".crdownload", ".tmp", ".download", ".partial", ".swp")
#: Sources whose conversation ids are unique beyond one file (kept as they are).
GLOBAL_ID_SOURCES = frozenset({"chatgpt", "claude", "locomo"})

_BAD_FILE_ERRORS = (UnsupportedExportError, MalformedExportError, UnicodeError, OSError)


@dataclass(slots=True)
class FileResult:
    """What happened to one file. ``status``: "imported", "skipped" or "quarantined"."""

    path: Path  # where the file was when the import began
    status: str = "imported"
    format: str | None = None
    sha256: str | None = None
    conversations: int = 0  # conversations read from the file
    turns_added: int = 0
    facts_added: int = 0  # memories added (a memory export)
    reason: str | None = None  # why it was quarantined
    moved_to: Path | None = None
    seconds: float = 0.0


@dataclass(slots=True)
class ImportReport:
    """The outcome of one :meth:`Importer.import_path` call."""

    files: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def files_seen(self) -> int:
        return len(self.files)

    @property
    def imported(self) -> list[FileResult]:
        return [f for f in self.files if f.status == "imported"]

    @property
    def skipped(self) -> list[FileResult]:
        return [f for f in self.files if f.status == "skipped"]

    @property
    def quarantined(self) -> list[FileResult]:
        return [f for f in self.files if f.status == "quarantined"]

    @property
    def conversations(self) -> int:
        return sum(f.conversations for f in self.files)

    @property
    def turns_added(self) -> int:
        return sum(f.turns_added for f in self.files)

    @property
    def facts_added(self) -> int:
        return sum(f.facts_added for f in self.files)

    @property
    def turns_per_s(self) -> float:
        return self.turns_added / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class ProgressEvent:
    """Sent to ``on_progress``: "start" and "done" once per file, "conversation" after each.

    ``file_index`` counts from 1 to ``file_count``; ``result`` is set on "done".
    """

    kind: str
    path: Path
    file_index: int
    file_count: int
    conversations: int  # of this file, so far
    file_turns: int  # turns added from this file, so far
    total_turns: int  # turns added in this call, so far
    result: FileResult | None = None


def is_candidate(path: Path) -> bool:
    """False for dotfiles and partial downloads (``.part``, ``.crdownload``, ``.tmp``, …)."""
    return not path.name.startswith(".") and not path.name.lower().endswith(PARTIAL_SUFFIXES)


def list_files(folder: Path) -> list[Path]:
    """The candidate files directly in ``folder``, by modification time, then name."""
    found: list[tuple[int, str, Path]] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            path = Path(entry.path)
            try:
                if entry.is_file() and is_candidate(path):
                    found.append((entry.stat().st_mtime_ns, entry.name, path))
            except OSError:  # vanished while listing
                continue
    return [path for _, _, path in sorted(found)]


def quarantine_reason(path: Path, exc: Exception) -> str:
    """Why ``path`` was not imported and what to do, for the person importing it.

    The importers' errors already say both; a file-system error is told as one that cannot be
    read, with its cause (``No such file or directory``, ``Permission denied``).
    """
    if isinstance(exc, UnsupportedExportError | MalformedExportError):
        return str(exc)
    if isinstance(exc, UnicodeError):
        return (
            f"{path}: the file is not valid UTF-8 text ({exc}). Save it as UTF-8 (or export it"
            " again) and import it again."
        )
    if isinstance(exc, OSError):
        cause = exc.strerror or str(exc) or type(exc).__name__
        return (
            f"{path}: the file could not be read ({cause}). Check that it exists, is a file and"
            " that you may read it, then import it again."
        )
    return f"{path}: {exc or type(exc).__name__}"


def file_sha256(path: Path) -> str:
    """sha256 hex of the file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def stat_signature(path: Path) -> tuple[int, int] | None:
    """``(size, mtime_ns)`` of ``path``, ``None`` if it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class Importer:
    """Imports export files into one profile of a fact log.

    Args:
        factlog: the fact log (used only from the thread that opened it).
        profile_id: the profile the conversations belong to.
        inbox_root: the watched inbox; files directly in it are filed away after import.
    """

    def __init__(self, factlog: FactLog, profile_id: int, inbox_root: Path) -> None:
        self.factlog = factlog
        self.profile_id = profile_id
        self.inbox_root = Path(inbox_root).expanduser().resolve()

    def import_path(
        self, path: Path, on_progress: Callable[[ProgressEvent], None] | None = None
    ) -> ImportReport:
        """Import a file, or every candidate file directly in a folder.

        Args:
            path: a file (imported whatever its name) or a folder.
            on_progress: called with a :class:`ProgressEvent` as the import advances.
        """
        path = Path(path)
        start = time.perf_counter()
        files = list_files(path) if path.is_dir() else [path]
        report = ImportReport()
        for index, file in enumerate(files, 1):
            done_before = report.turns_added

            def progress(
                kind: str, result: FileResult, index: int = index, before: int = done_before
            ) -> None:
                if on_progress is not None:
                    on_progress(
                        ProgressEvent(
                            kind,
                            result.path,
                            index,
                            len(files),
                            result.conversations,
                            result.turns_added,
                            before + result.turns_added,
                            result if kind == "done" else None,
                        )
                    )

            report.files.append(self._import_file(file, progress))
        report.seconds = time.perf_counter() - start
        return report

    # -- one file -------------------------------------------------------------------------

    def _import_file(self, path: Path, progress: Callable[[str, FileResult], None]) -> FileResult:
        start = time.perf_counter()
        result = FileResult(path=path)
        progress("start", result)
        signature = stat_signature(path)
        try:
            result.sha256 = file_sha256(path)
            if self.factlog.is_imported(self.profile_id, result.sha256):
                result.status = "skipped"
            else:
                result.format = detect_format(path)
                if result.format == memories.FORMAT:
                    result.facts_added = self._add_facts(path)
                for conv in parse_file(path, result.format):
                    result.turns_added += self._add(conv)
                    result.conversations += 1
                    progress("conversation", result)
        except _BAD_FILE_ERRORS as exc:
            result.status = "quarantined"
            result.reason = quarantine_reason(path, exc)
        if result.sha256 is not None and result.status != "skipped":
            self._record(result)
        if self._in_inbox(path):
            if signature is not None and stat_signature(path) == signature:
                result.moved_to = _file_away(path, self.inbox_root, result)
            else:
                logger.info("%s changed while it was imported; left in the inbox", path)
        result.seconds = time.perf_counter() - start
        progress("done", result)
        return result

    def _in_inbox(self, path: Path) -> bool:
        return path.expanduser().absolute().parent.resolve() == self.inbox_root

    def _record(self, result: FileResult) -> None:
        assert result.sha256 is not None
        self.factlog.record_import(
            self.profile_id,
            result.path.absolute(),
            result.sha256,
            fmt=result.format,
            status=result.status,
            reason=result.reason,
            conversations=result.conversations,
            turns_added=result.turns_added,
        )

    def _add_facts(self, path: Path) -> int:
        """Add a memory export's facts (checked whole first) in one transaction; return how
        many were new."""
        facts = memories.parse_facts(path)
        cause = f"imported from {path.name} (memory export)"
        added = 0
        with self.factlog.transaction():
            for fact in facts:
                _, created = self.factlog.add_fact(
                    self.profile_id,
                    fact.text,
                    fact.refers_to,
                    cause=cause,
                    created_at=fact.created_at,
                )
                added += created
        return added

    # -- one conversation -----------------------------------------------------------------

    def _add(self, conv: Conversation) -> int:
        """Store ``conv``; return the number of new turns."""
        if conv.source_id is not None and conv.source in GLOBAL_ID_SOURCES:
            return self.factlog.add_conversation(self.profile_id, conv)[1]
        if conv.source_id is None and not conv.turns:
            return 0  # nothing to store, and nothing to recognise it by later
        with self.factlog.transaction():  # resolving the key and adding it must not interleave
            conv.source_id = self._resolve_key(conv)
            return self.factlog.add_conversation(self.profile_id, conv)[1]

    def _resolve_key(self, conv: Conversation) -> str:
        """The module docstring's rule: the first key whose stored turns agree with ``conv``."""
        base = conv.source_id
        if base is None:
            base = "auto:" + _turn_digest(conv.turns[0])
        n = 1
        while True:
            key = base if n == 1 else f"{base}~{n}"
            conv_id = self.factlog.conversation_by_source(self.profile_id, conv.source, key)
            if conv_id is None or self.factlog.conversation_agrees(conv_id, conv.turns):
                return key
            n += 1


def _turn_row(turn: Turn) -> tuple[str, str, str | None]:
    """A turn as the ``(speaker, text, timestamp)`` hashed into ``auto:`` keys (stored keys
    depend on it: never change it)."""
    return turn.speaker, turn.text, None if turn.timestamp is None else turn.timestamp.isoformat()


def _turn_digest(turn: Turn) -> str:
    data = json.dumps(_turn_row(turn), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(data).hexdigest()[:32]


def _file_away(path: Path, inbox: Path, result: FileResult) -> Path | None:
    """Move an inbox file to ``imported/`` or ``quarantine/`` (with its reason file)."""
    quarantined = result.status == "quarantined"
    folder = inbox / (QUARANTINE_DIR if quarantined else IMPORTED_DIR)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        target = _free_name(folder, path.name)
        path.rename(target)
        if quarantined:
            reason = Path(f"{target}{REASON_SUFFIX}")
            reason.write_text(
                f"{path.name} could not be imported:\n\n{result.reason}\n\n"
                f"Fix or replace the file and put it in {inbox} again.\n",
                encoding="utf-8",
            )
    except OSError as exc:
        logger.warning("could not move %s to %s: %s", path, folder, exc)
        return None
    return target


def _free_name(folder: Path, name: str) -> Path:
    """``folder / name``, or ``name (2)``, ``name (3)``, … if taken (or its reason file is)."""
    stem, dot, suffix = name.partition(".") if not name.startswith(".") else (name, "", "")
    n = 1
    while True:
        candidate = folder / (name if n == 1 else f"{stem} ({n}){dot}{suffix}")
        reason = Path(f"{candidate}{REASON_SUFFIX}")
        if not candidate.exists() and not reason.exists():
            return candidate
        n += 1
