"""The message box: Enter sends, Up/Down recall earlier messages (like a shell)."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input


class PromptInput(Input):
    BINDINGS = [
        Binding("up", "recall(-1)", "Previous message", show=False),
        Binding("down", "recall(1)", "Next message", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history: list[str] = []
        self._index: int | None = None  # position in history while recalling
        self._draft = ""

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._index = None

    def set_history(self, texts: list[str]) -> None:
        self.history = [t for i, t in enumerate(texts) if i == 0 or texts[i - 1] != t]
        self._index = None

    def action_recall(self, step: int) -> None:
        if not self.history:
            return
        if self._index is None:
            if step > 0:
                return
            self._draft = self.value
            self._index = len(self.history)
        index = self._index + step
        if index >= len(self.history):
            self._index = None
            self.value = self._draft
        else:
            self._index = max(0, index)
            self.value = self.history[self._index]
        self.cursor_position = len(self.value)
