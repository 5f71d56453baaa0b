"""A started :class:`~inferscale_core.desk.Desk` on the test session's engine."""

from __future__ import annotations

from pathlib import Path

from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.desk import Desk
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.session import SessionConfig


def started_desk(runtime: wiring.Assistant, db: Path, profile: str = "default") -> Desk:
    """A desk over the fact log at ``db`` (made if new), its session open on ``runtime``'s
    engine: the deterministic extractor, 8-token replies, k=5, w=2 (what the tests look at)."""

    def opener(on_step):
        return wiring.open_session(
            runtime,
            AppConfig(),
            db,
            extractor=DeterministicExtractor(),
            session_config=SessionConfig(k=5, w=2, max_tokens=8, history_turns=2),
        )

    desk = Desk(db, profile, opener)
    desk.start().result()
    return desk
