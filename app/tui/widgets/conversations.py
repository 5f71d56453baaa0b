"""The conversation list: a search box over a list of titles."""

from __future__ import annotations

from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label, ListItem, ListView

from inferscale_core.types import ConversationInfo


class ConversationItem(ListItem):
    def __init__(self, info: ConversationInfo) -> None:
        super().__init__(Label(info.title, markup=False), Label(_subtitle(info), classes="dim"))
        self.info = info


def _subtitle(info: ConversationInfo) -> str:
    source = "" if info.source == "chat" else f"{info.source} · "
    return f"{source}{info.turns} turns"


class ConversationList(Vertical):
    """Posts :class:`Opened` when a conversation is picked, :class:`Searched` as the query
    changes; :meth:`set_items` shows what the screen found."""

    class Opened(Message):
        def __init__(self, conversation_id: int) -> None:
            self.conversation_id = conversation_id
            super().__init__()

    class Searched(Message):
        def __init__(self, query: str) -> None:
            self.query = query
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Conversations"

    def compose(self):
        yield Input(placeholder="search chats", id="conv-search")
        yield ListView(id="conv-list")

    @property
    def query_text(self) -> str:
        return self.query_one("#conv-search", Input).value

    async def set_items(self, infos: list[ConversationInfo], current: int | None) -> None:
        view = self.query_one("#conv-list", ListView)
        await view.clear()
        await view.extend(ConversationItem(info) for info in infos)
        for i, info in enumerate(infos):
            if info.id == current:
                view.index = i
                break

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "conv-search":
            event.stop()
            self.post_message(self.Searched(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "conv-search":
            event.stop()
            self.query_one("#conv-list", ListView).focus()

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, ConversationItem):
            self.post_message(self.Opened(event.item.info.id))
