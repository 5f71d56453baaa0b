"""The embedder: its forward (MiniLM's in few calls, :class:`BertForward`) computes what
sentence-transformers' encode does, any other model runs through its modules, bfloat16 stays
within a rounding of float32, and int8 (the default on an x86 CPU) within its quantization."""

from __future__ import annotations

import pytest
import torch

from inferscale_core.bert_forward import INT8, BertForward, int8_supported
from inferscale_core.embedder import SentenceTransformerEmbedder, default_dtype

TEXTS = [
    "What did Nadia bake?",
    "Tomas adopted a beagle mix from the shelter in 2023.",
    "ok",
    "My sister Ines moved to Lisbon in March 2024, after her job at the museum ended. " * 3,
    *(f"Fact {i}: the grey cat Miso likes the sunny window" for i in range(70)),
]  # 74 texts of mixed lengths: two batches of 64 and 10, sorted by length inside


@pytest.fixture(scope="module")
def fp32() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(dtype="float32")


@pytest.fixture(scope="module")
def bf16() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(dtype="bfloat16")


def test_float32_equals_encode_in_the_callers_order(fp32):
    model = fp32._load()
    assert isinstance(fp32._fast, BertForward)  # MiniLM takes the fused forward
    theirs = model.encode(
        TEXTS, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
    )  # [74, 384]
    ours = fp32.embed(TEXTS)
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == torch.float32
    assert (ours - theirs).abs().max() < 1e-6
    one = torch.cat([fp32.embed([text]) for text in TEXTS[:5]])  # unpadded, one at a time
    assert (one - theirs[:5]).abs().max() < 1e-5


def test_bfloat16_is_float32_within_a_rounding(fp32, bf16):
    ref, got = fp32.embed(TEXTS), bf16.embed(TEXTS)
    assert got.dtype == torch.float32  # pooled and normalised in float32
    assert torch.allclose(got.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)
    assert (ref * got).sum(dim=1).min() > 0.999  # cosine to the float32 vector
    # its vectors are stored under a name of their own: never mixed with float32 ones
    assert bf16.name == fp32.name + "+bf16"
    # what retrieval relies on: a paraphrase is nearer than an unrelated sentence
    tea = bf16.embed(["I like tea", "I enjoy drinking tea", "The bus was late"])
    assert tea[0] @ tea[1] > tea[0] @ tea[2]


def test_the_fused_forward_is_the_modules_within_a_rounding(fp32, bf16):
    model = bf16._load()
    fused = bf16.embed(TEXTS)  # padded batches
    one = bf16.embed([TEXTS[0]])  # one unpadded question
    generic = SentenceTransformerEmbedder(dtype="bfloat16")
    generic._load()
    generic._fast = None  # what a model of another shape runs: its modules
    modules, modules_one = generic.embed(TEXTS), generic.embed([TEXTS[0]])
    assert (fused * modules).sum(dim=1).min() > 0.9995
    assert (one * modules_one).sum() > 0.9999
    assert torch.allclose(fused.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)
    # both round float32; the fused forward (float32 embeddings) no worse than the modules
    ref = fp32.embed(TEXTS)
    assert (fused * ref).sum(dim=1).mean() >= (modules * ref).sum(dim=1).mean() - 1e-5
    assert BertForward.of(model, torch.bfloat16) is not None


def test_another_shape_runs_through_its_modules():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling

    minilm = SentenceTransformerEmbedder(dtype="float32")._load()
    cls = SentenceTransformer(modules=[minilm[0], Pooling(384, pooling_mode="cls")])
    assert BertForward.of(cls, torch.float32) is None  # CLS pooling: not MiniLM's shape
    no_norm = SentenceTransformer(modules=[minilm[0], minilm[1]])
    assert BertForward.of(no_norm, torch.float32) is None


needs_int8 = pytest.mark.skipif(
    not int8_supported(), reason="fbgemm's int8 linear needs an x86 CPU with AVX2 or AVX-512"
)


@needs_int8
def test_int8_is_float32_within_its_quantization(fp32):
    int8 = SentenceTransformerEmbedder(dtype="int8")
    ref, got = fp32.embed(TEXTS), int8.embed(TEXTS)
    assert int8.name == fp32.name + "+int8"  # never mixed with float32 or bfloat16 vectors
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert torch.allclose(got.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)
    cosine = (ref * got).sum(dim=1)  # [74]
    words = torch.tensor([" " in text for text in TEXTS])  # all but "ok"
    assert cosine[words].min() > 0.99
    # "ok" is 3 tokens: one activation scale spans [CLS]'s and [SEP]'s outlier values
    assert cosine[~words].min() > 0.97
    # each text runs alone: its vector is the same whatever batch it came in
    alone = torch.cat([int8.embed([text]) for text in TEXTS[:5]])
    assert torch.equal(alone, got[:5])
    tea = int8.embed(["I like tea", "I enjoy drinking tea", "The bus was late"])
    assert tea[0] @ tea[1] > tea[0] @ tea[2]


@needs_int8
def test_int8_runs_only_minilms_shape_and_auto_falls_back(tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling

    minilm = SentenceTransformerEmbedder(dtype="float32")._load()
    folder = tmp_path / "cls-pooled"
    SentenceTransformer(modules=[minilm[0], Pooling(384, pooling_mode="cls")]).save(str(folder))
    with pytest.raises(ValueError, match="int8' runs only MiniLM's shape"):
        SentenceTransformerEmbedder(folder, dtype="int8").embed(["hi"])
    auto = SentenceTransformerEmbedder(folder)
    assert auto.dtype == INT8  # until it loads and finds another shape
    assert auto.embed(["hi"]).shape == (1, 384)
    assert auto.dtype in (torch.bfloat16, torch.float32) and not auto.name.endswith("+int8")
    with pytest.raises(ValueError, match="CPU only"):
        SentenceTransformerEmbedder(dtype="int8", device="cuda")


def test_default_dtype_follows_the_hardware():
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    floats = torch.bfloat16 if native else torch.float32
    assert default_dtype("cpu") == (INT8 if int8_supported() else floats)
    assert default_dtype("cuda") == torch.float32
    assert SentenceTransformerEmbedder().dtype == default_dtype("cpu")


def test_a_bad_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        SentenceTransformerEmbedder(dtype="float16")
