"""The tests' oracle encoder (HFReferenceEncoder) on a 3-layer random SmolLM2-shaped model.

CUDA runs the oracle with ``sdpa`` attention; here we check on the CPU that a right-padded
``sdpa`` batch gives what ``eager`` gives for each entry alone (the claim that choice rests on),
that entries come out in the asked dtype, each owning its memory, and that their keys are the
pre-RoPE projections rotated to where the entry sat (the product's stored form).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.dummy import write_dummy_config
from inferscale_core.rope import RopeSpec
from tests.support.hf_encoder import HFReferenceEncoder, attention_implementation
from tests.support.rope_inverse import unrotate


def _model(model_dir: Path, attention: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(str(model_dir))
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny") / "smollm2"
    return write_dummy_config(folder, "smollm2-135m", {"num_hidden_layers": 3})


def _items() -> list[tuple[str, list[int], list[int]]]:
    gen = torch.Generator().manual_seed(1)
    sizes = [(5, 7), (40, 3), (100, 20), (0, 9)]  # (context, entry) tokens: much padding
    return [
        (f"e{i}", torch.randint(3, 49000, (c,), generator=gen).tolist(),
         torch.randint(3, 49000, (n,), generator=gen).tolist())
        for i, (c, n) in enumerate(sizes)
    ]  # fmt: skip


def test_attention_is_sdpa_on_cuda_and_eager_elsewhere():
    assert attention_implementation("cuda") == attention_implementation("cuda:1") == "sdpa"
    assert attention_implementation(torch.device("cpu")) == "eager"


def test_sdpa_right_padded_batch_equals_eager_alone(model_dir):
    eager = HFReferenceEncoder.from_model(_model(model_dir, "eager"), "fp")
    sdpa = HFReferenceEncoder.from_model(_model(model_dir, "sdpa"), "fp")
    items = _items()
    for item, entry in zip(items, sdpa.encode_batch(items), strict=True):
        alone = eager.encode_one(*item)
        assert entry.k.shape == alone.k.shape == (3, len(item[2]), 3, 64)
        torch.testing.assert_close(entry.k, alone.k, rtol=0, atol=1e-5)
        torch.testing.assert_close(entry.v, alone.v, rtol=0, atol=1e-5)


def test_entries_have_the_serving_dtype_and_own_their_memory(model_dir):
    encoder = HFReferenceEncoder.from_model(
        _model(model_dir, "eager"), "fp", kv_dtype=torch.bfloat16, kv_device="cpu"
    )
    for entry in encoder.encode_batch(_items()):
        for t in (entry.k, entry.v):  # [layers, tokens, kv_heads, head_dim]
            assert t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.is_contiguous()
            assert t.untyped_storage().nbytes() == t.nbytes  # not a view of the whole batch


def test_keys_are_post_rope_at_the_entrys_own_positions(model_dir):
    model = _model(model_dir, "eager")
    encoder = HFReferenceEncoder.from_model(model, "fp")
    context, ids = list(range(10, 47)), list(range(60, 69))
    entry = encoder.encode_one("e", context, ids)
    assert entry.origin == len(context)
    captured: list[torch.Tensor] = []
    layer = model.model.layers[1].self_attn
    handle = layer.k_proj.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
    with torch.inference_mode():
        model.model(input_ids=torch.tensor([context + ids]), use_cache=False)
    handle.remove()
    pre = captured[0][0, len(context) :].reshape(len(ids), 3, 64)  # [tokens, kv_heads, head_dim]
    spec = RopeSpec.from_hf_config(model.config)
    positions = torch.arange(entry.origin, entry.origin + len(ids))
    torch.testing.assert_close(unrotate(entry.k[1], positions, spec), pre, rtol=0, atol=1e-5)
