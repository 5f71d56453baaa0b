"""Comma-separated command-line values, parsed the same way by every bench's front end
(``inferscale-assistant bench …`` and the GPU machine's ``python -m`` entry points)."""

from __future__ import annotations


def parse_names(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (order kept, blanks dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_ks(text: str, name: str = "--k") -> list[int]:
    """``"0,5,20"`` -> ``[0, 5, 20]`` (sorted, unique); ValueError with a clear message else."""
    try:
        ks = sorted({int(k) for k in parse_names(text)})
    except ValueError:
        raise ValueError(f"{name} takes comma-separated whole numbers, got {text!r}") from None
    if not ks or min(ks) < 0:
        raise ValueError(f"{name} needs whole numbers >= 0, got {text!r}")
    return ks
