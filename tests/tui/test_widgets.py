"""Widgets and helpers on their own, each in a small host app (no session)."""

from __future__ import annotations

import pytest
from textual.app import App

from app.tui.screens.chat import conversation_title
from app.tui.screens.settings import parse_form
from app.tui.widgets.prompt import PromptInput
from inferscale_core.config import ConfigError


class _Host(App):
    def compose(self):
        yield PromptInput(id="prompt")


@pytest.mark.asyncio
async def test_prompt_recalls_earlier_messages_and_keeps_the_draft():
    app = _Host()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("down")  # nothing to recall: nothing happens
        assert prompt.value == ""
        for text in ("first", "second", "second"):
            prompt.remember(text)
        assert prompt.history == ["first", "second"]
        await pilot.press(*"draft")
        await pilot.press("up")
        assert prompt.value == "second" and prompt.cursor_position == len("second")
        await pilot.press("up", "up")  # stops at the oldest
        assert prompt.value == "first"
        await pilot.press("down")
        assert prompt.value == "second"
        await pilot.press("down")
        assert prompt.value == "draft"


def test_conversation_title_from_the_first_message():
    assert conversation_title("  What is   my cat called? ") == "What is my cat called?"
    long = "Tell me everything you remember about the trip we planned to the fjords next summer"
    title = conversation_title(long)
    assert title.endswith("…") and len(title) <= 41 and title.startswith("Tell me everything")
    assert conversation_title("") == "New chat"


def test_settings_form_errors_are_clear():
    values = {"model": "", "k": "4", "w": "20", "gpu_pool_gib": "1.5", "profile": "work"}
    values |= {"max_tokens": "256", "history_tokens": "800", "temperature": ""}
    values |= {"top_p": " ", "repetition_penalty": "1.2", "recompute": "2"}
    config = parse_form(values, "llm")
    assert (config.max_tokens, config.history_tokens, config.recompute) == (256, 800, 2)
    assert (config.temperature, config.top_p, config.repetition_penalty) == (None, None, 1.2)
    assert (config.model, config.k, config.gpu_pool_gib, config.extractor) == (None, 4, 1.5, "llm")
    assert config.window == "anchored" and parse_form(values, "llm", "sliding").window == "sliding"
    assert config.kv_store_dtype == "auto"
    assert parse_form(values, "llm", "sliding", "model").kv_store_dtype == "model"
    assert config.kv_cache_dtype == "auto"
    assert parse_form(values, "llm", "sliding", "auto", "fp8").kv_cache_dtype == "fp8"
    assert config.weights == "auto"
    assert parse_form(values, "llm", "sliding", "auto", "auto", "fp8").weights == "fp8"
    with pytest.raises(ConfigError, match="kv_store_dtype must be one of auto, model, fp8, int4"):
        parse_form(values, "auto", "anchored", "int3")
    with pytest.raises(ConfigError, match="window must be one of anchored, sliding; got 'rolling'"):
        parse_form(values, "auto", "rolling")
    with pytest.raises(ConfigError, match="k must be a whole number, got 'four'"):
        parse_form(dict(values, k="four"), "auto")
    with pytest.raises(ConfigError, match="gpu_pool_gib must be a number of GiB >= 0"):
        parse_form(dict(values, gpu_pool_gib="-1"), "auto")
    with pytest.raises(ConfigError, match="profile must be a non-empty name"):
        parse_form(dict(values, profile=" "), "auto")
    with pytest.raises(ConfigError, match=r"top_p must be a number in \(0, 1\], got 1.5"):
        parse_form(dict(values, top_p="1.5"), "auto")
    with pytest.raises(ConfigError, match="max_tokens must be a whole number, got 'lots'"):
        parse_form(dict(values, max_tokens="lots"), "auto")


@pytest.mark.asyncio
async def test_a_model_that_cannot_start_is_explained(tmp_path):
    """The real opener with a model folder that does not exist: the screen says why."""
    from app.commands.chat import make_opener
    from app.tui.app import AssistantApp
    from app.tui.widgets.status import StatusBar
    from app.tui.widgets.transcript import ChatMessage
    from inferscale_core.config import AppConfig

    config = AppConfig(model=str(tmp_path / "no-such-model"))
    db = tmp_path / "memory.db"
    app = AssistantApp(
        config,
        make_opener(config, db),
        db_path=db,
        config_path=tmp_path / "c.toml",
        inbox=tmp_path / "inbox",
    )
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            while app.load_error is None:
                await pilot.pause(0.05)
            assert "does not exist" in app.load_error
            label = str(app.chat.query_one("#startup-label").render())
            assert "the engine did not start" in label
            app.chat.query_one(StatusBar).refresh_status()
            assert "engine failed" in str(app.chat.query_one(StatusBar).render())
            await pilot.press(*"hello", "enter")
            message = app.chat.query(ChatMessage).last()
            while app.chat.answering is not None:
                await pilot.pause(0.05)
            assert message.note.startswith("error: SessionNotReadyError: the assistant did not")
    finally:
        app.host.close()


def test_settings_form_takes_the_disk_budget_and_recent_days():
    values = {"model": "", "k": "4", "w": "20", "gpu_pool_gib": "0", "profile": "work"}
    values |= {"max_tokens": "256", "history_tokens": "800", "temperature": ""}
    values |= {"top_p": "", "repetition_penalty": "", "recompute": "2"}
    config = parse_form(values, "auto")
    assert (config.kv_disk_budget, config.kv_encode_recent_days) == ("auto", 30)
    config = parse_form(values | {"kv_disk_budget": "1.5GiB", "kv_encode_recent_days": "7"}, "auto")
    assert (config.kv_disk_budget, config.kv_encode_recent_days) == ("1.5GiB", 7)
    config = parse_form(values | {"kv_disk_budget": "123", "kv_encode_recent_days": "all"}, "auto")
    assert (config.kv_disk_budget, config.kv_encode_recent_days) == (123, "all")
    with pytest.raises(ConfigError, match="kv_disk_budget must be auto, off or a size"):
        parse_form(values | {"kv_disk_budget": "big"}, "auto")
    with pytest.raises(ConfigError, match="kv_encode_recent_days must be"):
        parse_form(values | {"kv_encode_recent_days": "-3"}, "auto")
