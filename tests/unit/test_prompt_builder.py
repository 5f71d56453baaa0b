"""PromptBuilder.encode_many on a 2-layer random SmolLM2-shaped model (fp32, CPU).

Batches are formed shortest first to pad little; the entries must be what each fact encoded
alone gives, and the result must keep the caller's order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.dummy import write_dummy_config
from inferscale_core.encoding import HFReferenceEncoder
from inferscale_core.fingerprint import model_fingerprint
from inferscale_core.kvstore import KVStore
from inferscale_core.prompt_builder import MemoryFact, PromptBuilder

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
    encoder = HFReferenceEncoder.from_model(model, model_fingerprint(model_dir))
    layout = ChatLayout(AutoTokenizer.from_pretrained(str(smollm2_path)), "You are helpful.")
    return PromptBuilder(layout, encoder, KVStore(folder / "kv"), batch_size=2)


def test_batches_go_shortest_first_and_match_facts_encoded_alone(builder, monkeypatch):
    # Long and short contexts interleaved: in the caller's order every batch would pad a lot.
    facts = [
        MemoryFact(f"fact number {i} " + "word " * (i % 3), context=tuple(TURNS[: (5 * i) % 6]))
        for i in range(7)
    ]
    batches: list[list[int]] = []
    encode_batch = builder.encoder.encode_batch

    def spy(items):
        batches.append([len(ctx) + len(ids) for _, ctx, ids in items])
        return encode_batch(items)

    monkeypatch.setattr(builder.encoder, "encode_batch", spy)
    entries = builder.encode_many(facts, "sorted")
    lengths = [n for batch in batches for n in batch]
    assert lengths == sorted(lengths) and len(lengths) == len(facts)

    for fact, (key, ids) in zip(facts, entries, strict=True):
        assert builder.encode_many([fact], "sorted") == [(key, ids)]  # same order, no re-encode
        alone = encode_batch([(key, builder.context_ids(fact.context), ids)])[0]
        stored = builder.store.get(key)
        assert stored.k.shape == alone.k.shape  # [layers, tokens, kv_heads, head_dim]
        torch.testing.assert_close(stored.k, alone.k, rtol=0, atol=1e-5)
        torch.testing.assert_close(stored.v, alone.v, rtol=0, atol=1e-5)
    assert len(batches) == 4  # 7 facts in batches of 2; nothing was encoded twice


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"torch_dtype": "float32"}, torch.bfloat16),  # SmolLM2 as unpacked: vLLM downcasts
        ({"torch_dtype": "bfloat16"}, torch.bfloat16),
        ({"torch_dtype": "float16"}, torch.float16),
        ({"dtype": "float16"}, torch.float16),  # transformers 5 writes "dtype"
        ({}, torch.bfloat16),
    ],
)
def test_gpu_encoder_uses_the_dtype_vllm_serves_the_checkpoint_in(tmp_path, config, expected):
    import json

    from inferscale_core.prompt_builder import gpu_serving_dtype

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert gpu_serving_dtype(tmp_path) == expected
