"""Token layout: prefix / memory span / suffix split of the model's own chat template."""

from __future__ import annotations

from datetime import date

import pytest

from inferscale_core import composer
from inferscale_core.composer import ChatLayout, TemplateError, entry_key, fact_line


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_path))


def test_fact_line_is_dated_and_single_line():
    assert fact_line("I  like\n cats.", date(2023, 5, 8)) == "- 2023-05-08 I like cats.\n"
    assert fact_line("No date here.") == "- No date here.\n"


def test_layout_concatenation_is_the_rendered_template(tokenizer):
    layout = ChatLayout(tokenizer, "You are kind.")
    lines = [fact_line("I adopted a cat named Miso.", date(2023, 5, 8)), fact_line("I run.")]
    ids = layout.prompt_text_ids(lines, "What is my cat called?")
    messages = [
        {"role": "system", "content": "You are kind.\n\nMemory:\n" + "".join(lines)},
        {"role": "user", "content": "What is my cat called?"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Same text, and the same ids as tokenizing the whole prompt at once.
    assert tokenizer.decode(ids) == rendered
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert tokenizer.decode(layout.prefix_ids).endswith("Memory:\n")


def test_compose_places_entries_back_to_back(tokenizer):
    layout = ChatLayout(tokenizer, "You are kind.")
    a = layout.fact_ids(fact_line("Fact A."))
    b = layout.fact_ids(fact_line("Fact B is longer than A."))
    composed = layout.compose("prefix-x", [("fact-a", a), ("fact-b", b)], "Q?", cache_salt="s")
    p = len(layout.prefix_ids)
    assert [(e.key, e.start, e.end) for e in composed.entries] == [
        ("prefix-x", 0, p),
        ("fact-a", p, p + len(a)),
        ("fact-b", p + len(a), p + len(a) + len(b)),
    ]
    assert composed.span_end == p + len(a) + len(b)
    assert composed.prompt_ids[p : p + len(a)] == a
    assert composed.fact_keys == ["fact-a", "fact-b"]
    params = composed.kv_transfer_params("fp")["inferscale"]
    assert params["fingerprint"] == "fp" and params["entries"][1] == ["fact-a", p, p + len(a)]


def test_history_goes_into_the_suffix_only(tokenizer):
    layout = ChatLayout(tokenizer, "You are kind.")
    plain = layout.suffix_ids("Q?")
    with_history = layout.suffix_ids("Q?", [("user", "hi"), ("assistant", "hello")])
    assert len(with_history) > len(plain)
    # two history turns, the question, the assistant header
    assert tokenizer.decode(with_history).count("<|im_start|>") == 4
    # remembered per (question, history), and a caller's edit never reaches the memo
    plain.append(-1)
    assert layout.suffix_ids("Q?") == plain[:-1]
    assert layout.suffix_ids("Q?", [("user", "hi"), ("assistant", "hello")]) == with_history
    assert layout.suffix_ids("Q?", [("user", "hi")]) != with_history


class _DropsSystem:
    """A template that ignores the system message: memory cannot be placed."""

    def apply_chat_template(self, conversation, **kwargs):
        return "".join(m["content"] for m in conversation if m["role"] != "system")

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_remembered_suffixes_are_bounded_in_token_ids(tokenizer):
    """The suffix cache holds at most SUFFIX_IDS_BUDGET ids together, whatever the turns'
    lengths (it was 256 entries of any length: ~2.8 GB of over-long questions, issue 35)."""
    layout = ChatLayout(tokenizer, "You are kind.")
    budget = composer.SUFFIX_IDS_BUDGET
    long = "word " * (budget // 10)  # about a tenth of the budget in tokens
    for i in range(12):
        ids = layout.suffix_ids(f"{i} {long}")
        assert budget // 11 < len(ids) and ids == layout.suffix_ids(f"{i} {long}")  # remembered
        held = sum(len(v) for v in layout._suffix_ids.values())
        assert held <= budget
    assert 1 < len(layout._suffix_ids) < 12
    huge = layout.suffix_ids("word " * (budget // 4))  # past what one entry may take
    assert len(huge) > budget // 4 and sum(len(v) for v in layout._suffix_ids.values()) <= budget
    assert layout.suffix_ids("Q?") == layout.suffix_ids("Q?", ())  # short ones as before


def test_template_that_drops_the_system_prompt_is_refused():
    with pytest.raises(TemplateError, match="system"):
        ChatLayout(_DropsSystem(), "sys")


def test_entry_keys_depend_on_everything_that_changes_the_kv():
    base = entry_key("fact", "fp", "enc/1", (1, 2), (3, 4))
    assert base == entry_key("fact", "fp", "enc/1", (1, 2), (3, 4))
    assert base != entry_key("fact", "fp2", "enc/1", (1, 2), (3, 4))  # model
    assert base != entry_key("fact", "fp", "enc/1", (1, 9), (3, 4))  # context
    assert base != entry_key("fact", "fp", "enc/2", (1, 2), (3, 4))  # encoder
