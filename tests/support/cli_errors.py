"""What a refused command printed: one ``error: ...`` line on stderr, no traceback."""

from __future__ import annotations


def one_error_line(capsys) -> str:
    """The one line the command wrote to stderr (asserted: a single ``error:`` line, no
    traceback)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]
