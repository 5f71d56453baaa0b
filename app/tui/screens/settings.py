"""Settings: model, k, w, window, GPU pool, profile, extractor, how memories' KV is stored and
how much disk it may take, how the model's weights are served; saved to the TOML config
file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Input, Label, Select, Static

from app.tui.widgets.status import StatusBar
from inferscale_core.config import (
    EXTRACTORS,
    KV_CACHE_DTYPES,
    KV_STORE_DTYPES,
    WEIGHTS_SETTINGS,
    AppConfig,
    ConfigError,
    save,
)
from inferscale_core.context_window import ANCHORED, WINDOWS
from inferscale_core.generation import EMBEDDED

#: Settings that only take effect when the assistant starts again (k applies at once).
RESTART_KEYS = (
    "model",
    "w",
    "window",
    "gpu_pool_gib",
    "profile",
    "extractor",
    "kv_store_dtype",
    "kv_cache_dtype",
    "weights",
    "kv_disk_budget",
    "kv_encode_recent_days",
    "max_tokens",
    "history_tokens",
    "temperature",
    "top_p",
    "repetition_penalty",
)

FIELDS = (
    ("model", "Model: a folder, a .gguf file or an added name; empty = SmolLM2 (restart)"),
    ("k", "k: memories retrieved per reply, default 50 (from the next reply)"),
    ("recompute", "r: of those, the best r prefilled with the question, not injected (next reply)"),
    ("w", "w: context turns each memory is encoded with (restart; re-encodes)"),
    ("gpu_pool_gib", "GPU pool budget for the KV store, GiB; 0 = no device tier (restart)"),
    ("profile", "Profile: whose memory (restart)"),
    ("inbox", "Inbox folder: exports dropped here are imported; empty = data folder's (at once)"),
    ("max_tokens", "Reply length limit, tokens (restart)"),
    ("history_tokens", "Recent turns kept in the prompt, at most this many tokens (restart)"),
    ("temperature", "Temperature: empty = the model's default; 0 = greedy (restart)"),
    ("top_p", "Top-p: empty = the model's default (restart)"),
    ("repetition_penalty", "Repetition penalty: empty = the model's default; 1 = none (restart)"),
    (
        "kv_disk_budget",
        "Disk for memories' KV: auto = 25% of the free disk, off, or a size like 20 GB; past it"
        " the least recently used KV is dropped, the memory kept (restart)",
    ),
    (
        "kv_encode_recent_days",
        "Imports: facts from turns older than this many days before a chat's last are encoded"
        " when first retrieved; all = encode every one (restart)",
    ),
)
OPTIONAL = ("temperature", "top_p", "repetition_penalty")  # empty: the model's default

CHOICES = (  # (setting, label, its options): a Select each
    (
        "window",
        "Window: anchored = w to 2w-1 turns, shared (fast); sliding = the w before (restart)",
        WINDOWS,
    ),
    (
        "extractor",
        "Fact extractor: auto = rules for the embedded model, the LLM otherwise (restart)",
        EXTRACTORS,
    ),
    (
        "kv_store_dtype",
        "Memory KV kept as: auto = int4 (model with an fp8 cache); model = exact"
        " (restart; older entries are rewritten in the background)",
        KV_STORE_DTYPES,
    ),
    (
        "kv_cache_dtype",
        "Engine KV cache: auto = the model's dtype; fp8 = half the memory, twice the tokens (a"
        " GPU, or a CPU with AVX-512; restart; memories are encoded again for it)",
        KV_CACHE_DTYPES,
    ),
    (
        "weights",
        "Model weights: auto = as stored (a GGUF dequantized); as-stored = refuse a model that"
        " must be dequantized; fp8 = quantized on load, half of bf16 (a GPU; restart)",
        WEIGHTS_SETTINGS,
    ),
)


def parse_form(
    values: dict[str, str],
    extractor: str,
    window: str = ANCHORED,
    kv_store_dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    weights: str = "auto",
) -> AppConfig:
    """An :class:`AppConfig` from the form's text, or :class:`ConfigError` saying what's wrong."""

    def number(name: str, kind: type) -> int | float | None:
        text = values[name].strip()
        if not text and name in OPTIONAL:
            return None
        try:
            return kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise ConfigError(f"{name} must be {what}, got {text!r}") from None

    return AppConfig(
        model=values["model"].strip() or None,
        k=number("k", int),
        recompute=number("recompute", int),
        w=number("w", int),
        window=window,
        gpu_pool_gib=number("gpu_pool_gib", float),
        profile=values["profile"].strip(),
        inbox=values.get("inbox", "").strip() or None,
        extractor=extractor,
        kv_store_dtype=kv_store_dtype,
        kv_cache_dtype=kv_cache_dtype,
        weights=weights,
        kv_disk_budget=_budget(values.get("kv_disk_budget", "")),
        kv_encode_recent_days=_recent_days(values.get("kv_encode_recent_days", "")),
        max_tokens=number("max_tokens", int),
        history_tokens=number("history_tokens", int),
        temperature=number("temperature", float),
        top_p=number("top_p", float),
        repetition_penalty=number("repetition_penalty", float),
    )


def _budget(text: str) -> str | int:
    """The disk budget field: empty is "auto", a plain number is bytes (AppConfig checks it)."""
    text = text.strip()
    return int(text) if text.isdigit() else text or "auto"


def _recent_days(text: str) -> str | int:
    """The recent-days field: empty is the default (30), "all", or a whole number of days."""
    text = text.strip()
    if not text:
        return AppConfig().kv_encode_recent_days
    try:
        return int(text)
    except ValueError:
        return text  # "all", or what AppConfig refuses with its message


class SettingsScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("ctrl+s", "save", "Save"),
    ]

    def __init__(self, config: AppConfig, path: Path) -> None:
        super().__init__(id="settings")
        self.config = config
        self.path = Path(path)

    def compose(self):
        yield Header()
        with VerticalScroll(id="settings-form"):
            for name, label in FIELDS:
                value = getattr(self.config, name)
                yield Label(label, classes="field-label")
                yield Input(
                    "" if value is None else str(value),
                    placeholder=self._default_of(name),
                    id=f"set-{name}",
                    compact=True,
                )
            for name, label, options in CHOICES:
                yield Label(label, classes="field-label")
                yield Select(
                    [(o, o) for o in options],
                    value=getattr(self.config, name),
                    allow_blank=False,
                    compact=True,
                    id=f"set-{name}",
                )
            yield Label("", id="settings-error", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Save (Ctrl+S)", id="save", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")
            yield Static(f"Saved to {self.path}", classes="dim", markup=False)
        yield StatusBar()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#set-model").focus()

    def _default_of(self, name: str) -> str:
        """What an empty optional field means: the embedded model's value (another model's
        comes from its folder at start-up)."""
        if name not in OPTIONAL:
            return ""
        if self.config.model is not None:
            return "the model's default"
        return f"{getattr(EMBEDDED, name)} (the embedded SmolLM2's default)"

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "save":
            await self.action_save()
        else:
            self.app.pop_screen()

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        await self.action_save()

    async def action_save(self) -> None:
        values = {name: self.query_one(f"#set-{name}", Input).value for name, _ in FIELDS}
        extractor = str(self.query_one("#set-extractor", Select).value)
        window = str(self.query_one("#set-window", Select).value)
        kv_store_dtype = str(self.query_one("#set-kv_store_dtype", Select).value)
        kv_cache_dtype = str(self.query_one("#set-kv_cache_dtype", Select).value)
        weights = str(self.query_one("#set-weights", Select).value)
        error = self.query_one("#settings-error", Label)
        try:
            new = parse_form(values, extractor, window, kv_store_dtype, kv_cache_dtype, weights)
        except ConfigError as exc:
            error.update(str(exc))
            return
        try:
            await asyncio.to_thread(save, new, self.path)
        except OSError as exc:
            error.update(f"could not save {self.path}: {exc}")
            return
        later = [k for k in RESTART_KEYS if getattr(new, k) != getattr(self.config, k)]
        self.app.apply_config(new)
        note = f" {', '.join(later)}: at the next start." if later else ""
        self.notify(f"Settings saved. k and r apply to the next reply.{note}")
        self.app.pop_screen()
