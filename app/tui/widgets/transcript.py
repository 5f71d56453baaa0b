"""The transcript: one :class:`ChatMessage` per turn; replies stream into a Markdown view."""

from __future__ import annotations

from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Markdown, Static

from inferscale_core.session import Reply


class ChatMessage(Vertical):
    """One turn: who said it, and the text (Markdown for the assistant's replies).

    A reply remembers its :class:`Reply` (facts, timings) and the k and mode it was asked
    with, for the memory panel; focusing it posts :class:`ChatMessage.Selected`.
    """

    can_focus = True

    class Selected(Message):
        def __init__(self, message: ChatMessage) -> None:
            self.message = message
            super().__init__()

    def __init__(self, speaker: str, text: str = "", *, role: str = "assistant", note: str = ""):
        super().__init__(classes=f"message {role}")
        self.speaker = speaker
        self.role = role
        self.text = text
        self.note = note
        self.reply: Reply | None = None
        self.k: int | None = None
        self.mode: str | None = None
        self._stream = None

    def compose(self):
        yield Label(self.speaker, classes="speaker")
        if self.role == "assistant":
            yield Markdown(self.text, classes="body")
        else:
            yield Static(self.text, markup=False, classes="body")
        yield Label(self.note, classes="note", markup=False)

    def set_note(self, note: str) -> None:
        self.note = note
        self.query_one(".note", Label).update(note)

    async def append(self, delta: str) -> None:
        """Stream a piece of the reply into the Markdown view."""
        if not delta:
            return
        if self._stream is None:
            self.set_note("")
            self._stream = Markdown.get_stream(self.query_one(Markdown))
        self.text += delta
        await self._stream.write(delta)

    async def finish(self, text: str | None = None, note: str = "") -> None:
        """Stop the stream and render the whole text once (a clean re-parse)."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        if text is not None:
            self.text = text
        if self.role == "assistant":
            await self.query_one(Markdown).update(self.text.strip())
        self.set_note(note)

    def on_focus(self) -> None:
        self.post_message(self.Selected(self))


class Transcript(VerticalScroll):
    """The messages of the open conversation, kept scrolled to the newest."""

    def on_mount(self) -> None:
        self.anchor()

    async def add(self, *messages: ChatMessage) -> None:
        await self.mount_all(messages)
        self.scroll_end(animate=False)

    async def clear(self) -> None:
        await self.remove_children()

    @property
    def replies(self) -> list[ChatMessage]:
        return [m for m in self.query(ChatMessage) if m.reply is not None]
