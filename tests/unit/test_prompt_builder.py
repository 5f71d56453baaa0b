"""PromptBuilder.encode_many on a 2-layer random SmolLM2-shaped model (fp32, CPU), with the
oracle encoder (the product's encodes through the engine: tests/engine).

Facts go to the encoder in the caller's order (consecutive facts share context turns, which the
engine's prefix cache computes once), in batches, each new entry once; the entries must be what
each fact encoded alone gives, and the result must keep the caller's order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.dummy import write_dummy_config
from inferscale_core.fingerprint import model_fingerprint
from inferscale_core.kvstore import KVStore
from inferscale_core.prompt_builder import MemoryFact, PromptBuilder
from tests.support.hf_encoder import HFReferenceEncoder

TURNS = [f"Caroline: turn {i} about the support group and the painting" for i in range(6)]


@pytest.fixture(scope="module")
def builder(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> PromptBuilder:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from inferscale_core.composer import ChatLayout

    folder = tmp_path_factory.mktemp("tiny")
    model_dir = write_dummy_config(folder / "smollm2", "smollm2-135m", {"num_hidden_layers": 2})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(str(model_dir)), attn_implementation="eager"
    )
    fingerprint = model_fingerprint(model_dir)
    encoder = HFReferenceEncoder.from_model(model, fingerprint)
    encoder.store = KVStore(folder / "kv", fingerprint=fingerprint)
    layout = ChatLayout(AutoTokenizer.from_pretrained(str(smollm2_path)), "You are helpful.")
    return PromptBuilder(layout, encoder, encoder.store, batch_size=2)


def test_facts_are_encoded_in_order_once_and_match_facts_encoded_alone(builder, monkeypatch):
    facts = [
        MemoryFact(f"fact number {i} " + "word " * (i % 3), context=tuple(TURNS[: (5 * i) % 6]))
        for i in range(7)
    ]
    facts.append(facts[2])  # the same fact twice in one call: encoded once
    batches: list[list[str]] = []
    encode = builder.encoder.encode
    encode_batch = builder.encoder.encode_batch

    def spy(items):
        batches.append([item.key for item in items])
        return encode(items)

    monkeypatch.setattr(builder.encoder, "encode", spy)
    entries = builder.encode_many(facts, "ordered")
    keys = [key for key, _ in entries]
    assert [key for batch in batches for key in batch] == list(dict.fromkeys(keys))

    for fact, (key, ids) in zip(facts, entries, strict=True):
        assert builder.encode_many([fact], "ordered") == [(key, ids)]  # same order, no re-encode
        alone = encode_batch([(key, builder.context_ids(fact.context), ids)])[0]
        stored = builder.store.get(key)
        assert stored.k.shape == alone.k.shape  # [layers, tokens, kv_heads, head_dim]
        torch.testing.assert_close(stored.k, alone.k, rtol=0, atol=1e-5)
        torch.testing.assert_close(stored.v, alone.v, rtol=0, atol=1e-5)
    assert len(batches) == 4  # 7 facts in batches of 2; nothing was encoded twice
