"""The two errors an importer may raise for bad input (both are ``ValueError``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: The formats as people know them (module ``FORMAT`` → name in messages).
FORMAT_NAMES = {
    "chatgpt": "ChatGPT",
    "claude": "Claude",
    "locomo": "LoCoMo",
    "jsonl": "JSON Lines",
    "whatsapp": "WhatsApp",
    "markdown": "Markdown",
    "memories": "memory",
}

#: What a person can do about a malformed file, per format (the default: edit it).
_REDO = {
    "chatgpt": "Export your data again from ChatGPT (Settings → Data controls → Export data)"
    " and import the new conversations.json.",
    "claude": "Export your data again from Claude (Settings → Privacy → Export data) and import"
    " the new conversations.json.",
    "whatsapp": "Export the chat again from WhatsApp (in the chat's menu: Export chat) and import"
    " the new .txt, or correct that line in a text editor.",
    "jsonl": 'Correct that line in a text editor (one JSON object per line, with "role" and'
    ' "content") and import the file again.',
    "locomo": "Import an unchanged copy of the LoCoMo data file.",
    "memories": "Export the memories again (`inferscale-assistant memory export -o FILE`) and"
    " import the new file; nothing of this one was added.",
}
_EDIT = "Correct that spot in a text editor and import the file again."

#: What the importers read, and what to give them instead of an unsupported file.
_EXPECTED = (
    "Import a ChatGPT or Claude export (conversations.json), a WhatsApp chat export (.txt), or"
    ' the chat saved as Markdown ("Name: text" lines) or JSON Lines, or a file written by'
    " `inferscale-assistant memory export`."
)


class UnsupportedExportError(ValueError):
    """The file is not in any format the importers know.

    ``reasons`` maps every format that was tried to the reason it did not match. The message's
    first line says what is wrong and what to import instead; the next lines list the reasons
    (unless they are all the same, as for an empty file: then the first line has it).
    """

    def __init__(self, path: str | os.PathLike[str], reasons: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.reasons = dict(reasons)
        message = f"{self.path}: not a supported chat export"
        common = set(self.reasons.values())
        if len(common) == 1:  # one reason for all (the file is empty): no list
            message += f": {common.pop()}. {_EXPECTED}"
        else:
            tried = "\n".join(f"  - {fmt}: {why}" for fmt, why in self.reasons.items())
            message += f". {_EXPECTED}\nWhy each format did not match:\n{tried}"
        super().__init__(message)

    def __reduce__(self):  # keep the exception picklable despite the custom signature
        return (type(self), (self.path, self.reasons))


class MalformedExportError(ValueError):
    """The file is in a recognised format but its content is broken.

    ``location`` says where (``"line 12"``, ``"conversation at index 3 (id abc), node n1"``) and
    ``problem`` what is wrong there; the message ends with what the person can do about it.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: str, location: str, problem: str) -> None:
        self.path = Path(path)
        self.fmt = fmt
        self.location = location
        self.problem = problem
        name = FORMAT_NAMES.get(fmt, fmt)
        super().__init__(
            f"{self.path}: malformed {name} export ({location}): {problem}. "
            + _REDO.get(fmt, _EDIT)
        )

    def __reduce__(self):
        return (type(self), (self.path, self.fmt, self.location, self.problem))
