"""Chat-export importers: turn export files into :class:`~inferscale_core.types.Conversation`\\ s.

Use :func:`parse_file` (detects the format) or a format's own ``parse(path)``::

    for conversation in parse_file("conversations.json"):
        ...

Formats (one module each, registered in ``_MODULES``): ``chatgpt``, ``claude``, ``locomo``,
``jsonl``, ``whatsapp``, ``markdown``, and ``memories`` (our own ``memory export``: facts, not
conversations; the pipeline reads them with ``memories.parse_facts``). The import pipeline
(:mod:`.pipeline`) stores what they parse in the fact log; the inbox watcher (:mod:`.watcher`)
feeds it files as they arrive. The format is detected from the *content* of the first 64 KB
(:func:`detect_format`); the file name only breaks ties between formats whose content checks
both pass. Big JSON exports are streamed, one conversation at a time.

Errors: every problem caused by the file's bytes is one of two ``ValueError`` subclasses —
:class:`UnsupportedExportError` (no format matched; the message lists each format tried and
why it did not match) or :class:`MalformedExportError` (the format matched but the content is
broken; the message names the file, the place and the problem). Errors of the file system
itself (missing file, permissions, a directory) propagate as ``OSError``. Parsers are lazy:
content errors surface while iterating, possibly after some conversations were yielded.

Timestamps: aware UTC datetimes where the source gives epoch seconds (ChatGPT, JSON Lines
numbers) or ISO text with an offset (Claude); naive datetimes where the source has no zone
(WhatsApp, LoCoMo, ISO text without an offset); ``None`` where it has none.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from types import MappingProxyType

from inferscale_core.importers import (
    chatgpt,
    claude,
    jsonl,
    locomo,
    markdown,
    memories,
    whatsapp,
)
from inferscale_core.importers._common import as_path
from inferscale_core.importers._sniff import Sample, take_sample
from inferscale_core.importers.errors import MalformedExportError, UnsupportedExportError
from inferscale_core.types import Conversation

__all__ = [
    "FORMATS",
    "MalformedExportError",
    "UnsupportedExportError",
    "detect_format",
    "parse_file",
]

#: The format modules, in detection priority order (earlier wins a tie the file name does not
#: settle). Each has ``FORMAT`` (its name), ``check(sample) -> reason | None`` and
#: ``parse(path) -> Iterator[Conversation]``: adding a format is one entry here.
_MODULES = (chatgpt, claude, locomo, jsonl, whatsapp, markdown, memories)

FORMATS: tuple[str, ...] = tuple(module.FORMAT for module in _MODULES)
_CHECKS: MappingProxyType[str, Callable[[Sample], str | None]] = MappingProxyType(
    {module.FORMAT: module.check for module in _MODULES}
)
_PARSERS: MappingProxyType[str, Callable[[str | os.PathLike[str]], Iterator[Conversation]]] = (
    MappingProxyType({module.FORMAT: module.parse for module in _MODULES})
)
#: File-name hints, used only to break ties between formats whose content checks pass.
_NAME_HINTS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"locomo", re.IGNORECASE), ("locomo",)),
    (re.compile(r"^conversations(-\d+)?\.json$", re.IGNORECASE), ("chatgpt", "claude")),
    (re.compile(r"\.(jsonl|ndjson)$", re.IGNORECASE), ("jsonl", "claude")),
    (re.compile(r"^_chat\.txt$|whatsapp", re.IGNORECASE), ("whatsapp",)),
    (re.compile(r"\.(md|markdown)$", re.IGNORECASE), ("markdown",)),
)


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of the export at ``path``, judged from its first 64 KB.

    Returns one of :data:`FORMATS`. Raises :class:`UnsupportedExportError` when none matches
    (the message lists every format and why it did not match); ``OSError`` if unreadable.
    An empty JSON array matches every JSON-array format; the name decides, else ``"chatgpt"``
    (it parses to no conversations whichever format it is).
    """
    file = as_path(path)
    sample = take_sample(file)
    if not sample.stripped:
        raise UnsupportedExportError(
            file, {fmt: "the file is empty (or only whitespace)" for fmt in FORMATS}
        )
    reasons: dict[str, str] = {}
    matches: list[str] = []
    for fmt in FORMATS:
        reason = _CHECKS[fmt](sample)
        if reason is None:
            matches.append(fmt)
        else:
            reasons[fmt] = reason
    if not matches and sample.json is not None and sample.json.empty:
        matches = ["chatgpt", "claude", "locomo"]
    if not matches:
        raise UnsupportedExportError(file, reasons)
    return _tie_break(file.name, matches)


def parse_file(path: str | os.PathLike[str], fmt: str | None = None) -> Iterator[Conversation]:
    """Iterate the conversations in the export at ``path``.

    ``fmt`` forces a format (one of :data:`FORMATS`); by default it is detected at call time,
    so :class:`UnsupportedExportError` is raised by this call, while
    :class:`MalformedExportError` surfaces during iteration.
    """
    if fmt is None:
        fmt = detect_format(path)
    elif fmt not in _PARSERS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return _PARSERS[fmt](path)


def _tie_break(name: str, matches: list[str]) -> str:
    if len(matches) > 1:
        for pattern, hinted in _NAME_HINTS:
            if pattern.search(name):
                for fmt in hinted:
                    if fmt in matches:
                        return fmt
    return matches[0]
