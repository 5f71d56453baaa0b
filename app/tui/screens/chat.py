"""The chat screen: conversations on the left, the transcript and prompt, the memory panel.

Messages go up, calls go down: widgets post messages (a conversation picked, a reply focused),
the screen acts; the app calls :meth:`ChatScreen.sync_startup` as the engine loads. A reply
is asked for in a thread worker that pumps the session thread's deltas into the reply's
Markdown stream; Esc sets the cancel event, and the session thread closes the generator
(which aborts the engine request).
"""

from __future__ import annotations

import threading

from textual import work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Label, ProgressBar, Static
from textual.worker import get_current_worker

from app.tui.screens.dialogs import ConfirmDialog, TextDialog
from app.tui.widgets.conversations import ConversationList
from app.tui.widgets.memory_panel import MODE_NAMES, MemoryPanel
from app.tui.widgets.prompt import PromptInput
from app.tui.widgets.status import StatusBar
from app.tui.widgets.transcript import ChatMessage, Transcript, stored_reply
from inferscale_core.composer import TurnRejected
from inferscale_core.session import Reply
from inferscale_core.types import Conversation

MAX_TURNS_SHOWN = 200  # of a long (imported) conversation, the newest
WELCOME = (
    "Ask anything. What you tell me is remembered: facts are extracted from the chat, encoded "
    "as KV in the background, and injected into later replies (F3 shows which).\n\n"
    "Ctrl+N new chat · Ctrl+T KV injection ⇄ prompt injection · F4 memories · F5 import · "
    "F6 settings · Ctrl+P commands · F1 keys"
)


def conversation_title(text: str, limit: int = 40) -> str:
    """A title from the first message: its first line, cut at a word near ``limit``."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line or "New chat"
    cut = line[:limit].rsplit(" ", 1)[0] or line[:limit]
    return cut + "…"


def reply_note(reply: Reply) -> str:
    result = reply.result
    ttft = f" · TTFT {result.ttft_s * 1e3:,.0f} ms" if result and result.ttft_s else ""
    n = len(reply.facts)
    used = f"{n} {'memory' if n == 1 else 'memories'}" if n else "no memory"
    return " · ".join([f"{reply.mode} · {used}{ttft}", *reply.notes])


def _speaker(speaker: str) -> tuple[str, str]:
    if speaker == "user":
        return "you", "user"
    if speaker == "assistant":
        return "assistant", "assistant"
    return speaker, "user"


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+r", "rename_chat", "Rename chat", show=False),
        Binding("f8", "delete_chat", "Delete chat", show=False),
        Binding("ctrl+f", "find_chat", "Find chat", show=False),
        Binding("f3", "toggle_panel", "Memory panel"),
        Binding("ctrl+t", "toggle_mode", "Inject⇄prompt"),
        Binding("ctrl+y", "copy_reply", "Copy reply", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(id="chat")
        self.conversation_id: int | None = None
        self.answering: ChatMessage | None = None
        self._cancel: threading.Event | None = None

    def compose(self):
        yield Header()
        with Horizontal(id="chat-body"):
            yield ConversationList(id="sidebar")
            with Vertical(id="chat-main"):
                with Transcript(id="transcript"):
                    yield Static(WELCOME, id="welcome")
                with Horizontal(id="startup"):
                    yield Label("starting…", id="startup-label")
                    yield ProgressBar(show_eta=False, id="startup-bar")
                yield PromptInput(
                    placeholder="Message · Enter sends · ↑↓ earlier messages",
                    id="prompt",
                )
            yield MemoryPanel(id="memory-panel")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#prompt", PromptInput).focus()
        self.sync_startup()
        await self.reload_conversations()

    async def on_screen_resume(self) -> None:
        await self.reload_conversations()

    # ---- start-up (called by the app, and when the screen mounts) ----
    def sync_startup(self) -> None:
        """Show the app's start-up state: the current step, ready, or why it failed."""
        app = self.app
        label = self.query_one("#startup-label", Label)
        bar = self.query_one("#startup-bar", ProgressBar)
        if app.load_error is not None:
            label.update(f"the engine did not start: {app.load_error}")
            bar.display = False
        elif app.host.ready:
            self.query_one("#startup").display = False
        else:
            label.update(f"{app.load_step}…")
            bar.update(total=app.startup_steps, progress=app.steps_done)

    # ---- conversations ----
    async def reload_conversations(self) -> None:
        sidebar = self.query_one(ConversationList)
        query = sidebar.query_text
        infos = await self.app.read(lambda log, pid: log.conversations(pid, query, limit=200))
        await sidebar.set_items(infos, self.conversation_id)

    async def on_conversation_list_searched(self, event: ConversationList.Searched) -> None:
        await self.reload_conversations()

    async def on_conversation_list_opened(self, event: ConversationList.Opened) -> None:
        await self.open_conversation(event.conversation_id)

    async def open_conversation(self, conversation_id: int) -> None:
        if self.answering is not None:
            self.notify("Still answering: Esc stops the reply first.", severity="warning")
            return

        def load(log, pid):  # the turns, and what the shown replies used (memory panel)
            turns = log.conversation_turns(conversation_id)
            return turns, log.reply_details(tid for tid, _ in turns[-MAX_TURNS_SHOWN:])

        turns, details = await self.app.read(load)
        transcript = self.query_one(Transcript)
        await transcript.clear()
        if len(turns) > MAX_TURNS_SHOWN:
            hidden = len(turns) - MAX_TURNS_SHOWN
            await transcript.add(Static(f"… {hidden:,} earlier turns not shown", classes="dim"))
            turns = turns[-MAX_TURNS_SHOWN:]
        messages = []
        for turn_id, turn in turns:
            name, role = _speaker(turn.speaker)
            stored = details.get(turn_id)
            if stored is None:
                messages.append(ChatMessage(name, turn.text, role=role))
                continue
            reply = stored_reply(conversation_id, turn_id, turn.text, stored)
            message = ChatMessage(name, turn.text, role=role, note=reply_note(reply))
            message.reply, message.k, message.mode = reply, stored.k, reply.mode
            messages.append(message)
        await transcript.add(*messages)
        self.conversation_id = conversation_id
        prompt = self.query_one("#prompt", PromptInput)
        prompt.set_history([t.text for _, t in turns if t.speaker == "user"])
        prompt.focus()
        self.query_one(MemoryPanel).show(None)

    async def action_new_chat(self) -> None:
        if self.answering is not None:
            self.notify("Still answering: Esc stops the reply first.", severity="warning")
            return
        self.conversation_id = None
        transcript = self.query_one(Transcript)
        await transcript.clear()
        await transcript.add(Static(WELCOME, id="welcome"))
        self.query_one(MemoryPanel).show(None)
        self.query_one("#prompt", PromptInput).focus()
        await self.reload_conversations()

    def action_find_chat(self) -> None:
        self.query_one("#conv-search").focus()

    @work(exclusive=True, group="chat-dialog")
    async def action_rename_chat(self) -> None:
        cid = self.conversation_id
        if cid is None:
            self.notify("Send a message first: a new chat has no title yet.")
            return
        infos = await self.app.read(lambda log, pid: log.conversations(pid))
        current = next((i.title for i in infos if i.id == cid), "")
        title = await self.app.push_screen_wait(TextDialog("Rename conversation", current))
        if title:
            await self.app.read(lambda log, pid: log.rename_conversation(cid, title))
            await self.reload_conversations()

    @work(exclusive=True, group="chat-dialog")
    async def action_delete_chat(self) -> None:
        sidebar_list = self.query_one("#conv-list")
        item = getattr(sidebar_list, "highlighted_child", None)
        cid = item.info.id if item is not None and self.focused is sidebar_list else None
        cid = cid or self.conversation_id
        if cid is None:
            self.notify("No conversation selected.")
            return
        if self.answering is not None and cid == self.conversation_id:
            self.notify("Still answering: Esc stops the reply first.", severity="warning")
            return
        infos = await self.app.read(lambda log, pid: log.conversations(pid))
        info = next((i for i in infos if i.id == cid), None)
        if info is None:
            return
        body = (
            f"“{info.title}” and its {info.turns} turns will be deleted. Memories extracted "
            "from it stay (forget them in the memory browser, F4)."
        )
        dialog = ConfirmDialog("Delete conversation?", body, "Delete")
        if not await self.app.push_screen_wait(dialog):
            return
        await self.app.read(lambda log, pid: log.delete_conversation(cid))
        self.notify(f"Deleted “{info.title}”.")
        if cid == self.conversation_id:
            await self.action_new_chat()
        else:
            await self.reload_conversations()

    # ---- asking ----
    async def on_input_submitted(self, event) -> None:
        if event.input.id != "prompt":
            return
        event.stop()
        text = event.value.strip()
        if not text:
            return
        if self.answering is not None:
            self.notify("Still answering: wait, or Esc to stop it.", severity="warning")
            return
        prompt = self.query_one("#prompt", PromptInput)
        prompt.remember(text)
        prompt.value = ""
        if self.conversation_id is None:
            title = conversation_title(text)
            self.conversation_id = await self.app.read(
                lambda log, pid: log.add_conversation(pid, Conversation(title, source="chat"))[0]
            )
        for welcome in self.query("#welcome"):
            await welcome.remove()
        waiting = "" if self.app.host.ready else "waiting for the engine to start…"
        reply = ChatMessage("assistant", role="assistant", note=waiting or "thinking…")
        self.answering = reply
        await self.query_one(Transcript).add(ChatMessage("you", text, role="user"), reply)
        self._cancel = threading.Event()
        self.ask(self.conversation_id, text, reply, self._cancel, self.app.mode, self.app.config.k)
        await self.reload_conversations()

    @work(thread=True, exclusive=True, group="answer")
    def ask(
        self,
        conversation_id: int,
        text: str,
        message: ChatMessage,
        cancel: threading.Event,
        mode: str,
        k: int,
    ) -> None:
        """Stream a reply: the desk's thread answers, this one hands each delta to the view."""
        worker = get_current_worker()
        recompute = self.app.config.recompute  # like k: from the next reply
        stream = self.app.host.ask(
            text, conversation_id=conversation_id, k=k, mode=mode, recompute=recompute
        )
        reply, error = None, None
        try:
            for delta, last in stream:
                if worker.is_cancelled:  # the app is closing
                    return
                if cancel.is_set():  # Esc: the engine's request is aborted
                    reply = None
                    break
                if delta:
                    self.app.call_from_thread(message.append, delta)
                reply = last  # finished after the last item
        except TurnRejected as exc:  # empty, or longer than the model's context: not logged
            error = f"not sent: {exc}"
        except Exception as exc:  # noqa: BLE001 - shown in the transcript
            error = f"error: {type(exc).__name__}: {exc}"
        finally:
            stream.close()
        self.app.call_from_thread(self._finish, message, reply, error, k)

    async def _finish(
        self, message: ChatMessage, reply: Reply | None, error: str | None, k: int
    ) -> None:
        if error is not None:
            await message.finish(note=error)
        elif reply is None:
            await message.finish(note="stopped (Esc)")
        else:
            message.reply, message.k, message.mode = reply, k, reply.mode
            await message.finish(reply.text, note=reply_note(reply))
            panel = self.query_one(MemoryPanel)
            panel.record(reply, k)
            panel.show(reply, k)
        self.answering = None
        self._cancel = None
        await self.reload_conversations()

    def action_stop(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.notify("Stopping the reply.")
        elif self.focused is not None and self.focused.id != "prompt":
            self.query_one("#prompt", PromptInput).focus()

    # ---- memory panel, mode, copy ----
    def on_chat_message_selected(self, event: ChatMessage.Selected) -> None:
        if event.message.reply is not None:
            self.query_one(MemoryPanel).show(event.message.reply, event.message.k)

    def action_toggle_panel(self) -> None:
        panel = self.query_one(MemoryPanel)
        panel.display = not panel.display

    def action_toggle_mode(self) -> None:
        self.app.mode = "prompt" if self.app.mode == "inject" else "inject"
        self.notify(f"Next reply: {MODE_NAMES[self.app.mode]}.")

    def action_copy_reply(self) -> None:
        focused = self.focused
        if isinstance(focused, ChatMessage) and focused.role == "assistant":
            target = focused
        else:
            replies = [m for m in self.query(ChatMessage) if m.role == "assistant" and m.text]
            target = replies[-1] if replies else None
        if target is None or not target.text.strip():
            self.notify("No reply to copy yet.")
            return
        self.app.copy_to_clipboard(target.text.strip())
        self.notify("Reply copied to the clipboard.")
