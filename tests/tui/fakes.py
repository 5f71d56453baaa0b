"""A scripted stand-in for :class:`Session`, for the snapshot tests only.

Snapshots must be the same on every run, so the reply, the facts, the scores and the timings
here are fixed, and the seeded fact log has fixed timestamps. The behavioural tests
(``test_app_engine.py``) use the real engine and a real Session instead.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

from app.tui.app import AssistantApp
from inferscale_core.config import AppConfig
from inferscale_core.factlog import FactLog
from inferscale_core.memory_worker import WorkerStats
from inferscale_core.session import InjectedFact, Reply, SessionConfig
from inferscale_core.types import Conversation, GenerationResult, Turn

FIXED = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
FIXED_TEXT = FIXED.isoformat(timespec="microseconds")

REPLY = (
    "Your cat is called **Miso**. You adopted her from the shelter in May 2023:\n\n"
    "- she is grey\n- she came from the city shelter\n"
)
FACTS = [
    InjectedFact(
        1,
        "I adopted a grey cat named Miso from the shelter.",
        "2023-05-08",
        0.83,
        "injected",
        "host",
    ),
    InjectedFact(3, "Miso hates the vacuum cleaner.", None, 0.61, "injected", "disk"),
    InjectedFact(
        5, "My sister Ana moved to Lisbon for a job in biotech.", "2023-06-01", 0.22, "text"
    ),
]
NUMBERS = {  # mode -> (ttft, prompt tokens, cached, injected)
    "inject": (0.041, 212, 151, 124),
    "prompt": (0.118, 219, 27, 0),
}


class FakeWorker:
    def __init__(self) -> None:
        self.stats = WorkerStats(pending_facts=2, encoded_facts=40, encode_rate=6.5, running=True)

    def wake(self) -> None:
        pass


class ScriptedSession:
    """Answers every question with :data:`REPLY`, word by word, using :data:`FACTS`."""

    def __init__(self, db_path: Path, profile: str = "default") -> None:
        self.factlog = FactLog.open(db_path)
        self.profile_id = self.factlog.profile(profile)
        self.config = SessionConfig(k=10, w=20)
        self.worker = FakeWorker()

    def ask(self, conversation_id: int, text: str, *, mode: str | None = None, **options):
        mode = mode or self.config.mode  # the reply's, as the chat passes it
        self.factlog.append_turn(conversation_id, Turn("user", text, FIXED))
        reply = Reply(conversation_id, mode=mode)
        reply.facts = [
            InjectedFact(f.fact_id, f.text, f.refers_to, f.score, f.how, f.tier)
            if mode == "inject"
            else InjectedFact(f.fact_id, f.text, f.refers_to, f.score, "text")
            for f in FACTS
        ]
        for word in REPLY.split(" "):
            piece = word if not reply.text else " " + word
            reply.text += piece
            yield piece, reply
        ttft, prompt, cached, injected = NUMBERS[mode]
        reply.result = GenerationResult(
            "scripted",
            prompt_tokens=prompt,
            text=reply.text,
            ttft_s=ttft,
            cached_tokens=cached,
            injected_tokens=injected,
        )
        self.factlog.append_turn(conversation_id, Turn("assistant", reply.text, FIXED))
        yield "", reply

    def forget(self, fact_id: int, cause: str = "forgotten by the user") -> None:
        self.factlog.forget_fact(fact_id, cause)

    def edit(self, fact_id: int, new_text: str, cause: str = "edited by the user") -> int:
        return self.factlog.update_fact(fact_id, new_text, cause)

    def reopen(self, fact_id: int, cause: str = "undone by the user") -> None:
        self.factlog.reopen_fact(fact_id, cause)

    def close(self) -> None:
        self.factlog.close()


def seed(db_path: Path) -> None:
    """Two conversations and five memories, every timestamp fixed."""
    with FactLog.open(db_path) as log:
        pid = log.profile("default")
        turns = [
            Turn("user", "I adopted a grey cat named Miso from the shelter.", FIXED),
            Turn("assistant", "Congratulations! How is she settling in?", FIXED),
            Turn("user", "Miso hates the vacuum cleaner.", FIXED),
        ]
        cid, _ = log.add_conversation(pid, Conversation("Miso the cat", turns, "chat"))
        family = [
            Turn("Ana", "I'm moving to Lisbon for a job in biotech!", FIXED),
            Turn("me", "That's wonderful, when do you start?", FIXED),
        ]
        log.add_conversation(pid, Conversation("Familia", family, "whatsapp", "familia"))
        ids = [t for t, _ in log.conversation_turns(cid)]
        log.add_fact(pid, turns[0].text, refers_to=date(2023, 5, 8), source_turn_ids=[ids[0]])
        log.add_fact(pid, "I started learning the cello.", refers_to=date(2023, 9, 1))
        log.add_fact(pid, turns[2].text, source_turn_ids=[ids[2]])
        log.add_fact(pid, "I ran my first half marathon in 1 hour 52 minutes.")
        log.add_fact(
            pid, "My sister Ana moved to Lisbon for a job in biotech.", refers_to=date(2023, 6, 1)
        )
        with log.transaction():
            log.db.execute("UPDATE facts SET created_at = ?, updated_at = ?", (FIXED_TEXT,) * 2)
            log.db.execute("UPDATE audit SET at = ?", (FIXED_TEXT,))
            log.db.execute("UPDATE conversations SET created_at = ?", (FIXED_TEXT,))


def scripted_app(tmp_path: Path, import_root: Path | None = None) -> AssistantApp:
    db = tmp_path / "memory.db"
    seed(db)
    return AssistantApp(
        AppConfig(),
        lambda on_step: ScriptedSession(db),
        db_path=db,
        config_path=Path("/home/you/.config/inferscale-assistant/config.toml"),
        inbox=tmp_path / "inbox",
        import_root=import_root or tmp_path,
    )
