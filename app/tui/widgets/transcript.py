"""The transcript: one :class:`ChatMessage` per turn; replies stream into a Markdown view."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Markdown, Static

from inferscale_core.session import InjectedFact, Reply
from inferscale_core.types import GenerationResult, ReplyDetails

FORGOTTEN = "(forgotten)"


@dataclass(slots=True)
class StoredReply(Reply):
    """A reply read back from the fact log: its notes are the ones it was given."""

    stored_notes: list[str] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        return list(self.stored_notes)


def stored_reply(conversation_id: int, turn_id: int, text: str, details: ReplyDetails) -> Reply:
    """The :class:`Reply` of a stored assistant turn, for the memory panel, as it was live."""
    result = None
    if details.prompt_tokens is not None:
        computed = details.computed_tokens or 0
        result = GenerationResult(
            f"turn-{turn_id}",
            prompt_tokens=details.prompt_tokens,
            text=text,
            ttft_s=details.ttft_s,
            cached_tokens=details.prompt_tokens - computed,
            prefix_cached_tokens=details.prefix_cached_tokens or 0,
            injected_tokens=details.injected_tokens or 0,
            refused=details.refused,
        )
    facts = [
        InjectedFact(
            m.fact_id, FORGOTTEN if m.forgotten else m.text, m.refers_to, m.score, m.how, m.tier
        )
        for m in details.memories
    ]
    return StoredReply(
        conversation_id,
        text=text,
        facts=facts,
        result=result,
        mode=details.mode,
        assistant_turn_id=turn_id,
        stored_notes=list(details.notes),
    )


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
