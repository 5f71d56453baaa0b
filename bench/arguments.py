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


def parse_windows(text: str, name: str = "--w") -> list[int | str]:
    """Context windows: ``"0,20,20a"`` -> ``[0, 20, "20a"]``, a bare number the ``w`` turns
    before a fact (sliding), an ``a`` after it the anchored window of that ``w``
    (:mod:`inferscale_core.context_window`). Order kept, duplicates dropped."""
    specs: list[int | str] = []
    for part in parse_names(text):
        digits = part[:-1] if part.lower().endswith("a") else part
        if not digits.isdigit():
            raise ValueError(
                f"{name} takes comma-separated context sizes (20) or anchored ones (20a),"
                f" got {part!r} in {text!r}"
            )
        spec: int | str = int(digits) if digits == part else f"{int(digits)}a"
        if spec not in specs:
            specs.append(spec)
    if not specs:
        raise ValueError(f"{name} needs at least one context size, got {text!r}")
    return specs


def window_of(spec: int | str) -> tuple[int, str]:
    """``20`` -> ``(20, "sliding")``, ``"20a"`` -> ``(20, "anchored")`` (see
    :func:`parse_windows`)."""
    from inferscale_core.context_window import ANCHORED, SLIDING

    text = str(spec)
    if text.endswith("a"):
        return int(text[:-1]), ANCHORED
    return int(text), SLIDING
