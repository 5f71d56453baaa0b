"""The two errors an importer may raise for bad input (both are ``ValueError``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class UnsupportedExportError(ValueError):
    """The file is not in any format the importers know.

    ``reasons`` maps every format that was tried to the reason it did not match, so the message
    tells a person what the file would need to look like.
    """

    def __init__(self, path: str | os.PathLike[str], reasons: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.reasons = dict(reasons)
        tried = "\n".join(f"  - {fmt}: {why}" for fmt, why in self.reasons.items())
        super().__init__(
            f"{self.path}: not a supported chat export. Formats tried:\n{tried}\n"
            "If the file is one of these formats, call parse_file(path, fmt=<format>) to see "
            "exactly where it deviates."
        )

    def __reduce__(self):  # keep the exception picklable despite the custom signature
        return (type(self), (self.path, self.reasons))


class MalformedExportError(ValueError):
    """The file is in a recognised format but its content is broken.

    ``location`` says where (``"line 12"``, ``"conversation at index 3 (id abc), node n1"``) and
    ``problem`` what is wrong there.
    """

    def __init__(self, path: str | os.PathLike[str], fmt: str, location: str, problem: str) -> None:
        self.path = Path(path)
        self.fmt = fmt
        self.location = location
        self.problem = problem
        super().__init__(f"{self.path}: malformed {fmt} export ({location}): {problem}")

    def __reduce__(self):
        return (type(self), (self.path, self.fmt, self.location, self.problem))
