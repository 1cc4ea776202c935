"""CrossEncoderRunner against transformers on a tiny random-weight cross-encoder: the same scores whatever the
batching, each sentence-transformers activation, and the directory reading that picks them."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from rill.engine_proc.model.cross_encoder_layout import ScoreHead, is_cross_encoder, read_score_head
from rill.engine_proc.model.cross_encoder_runner import CrossEncoderRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.config import ModelConfig
from rill.ipc.protocol import SamplingParams
from tests.helpers.tiny_rerankers import MAX_POSITIONS, minilm_dir, reference_logits, save_tiny_cross_encoder

PAIRS = [("what is a cat", "a cat is a small feline"), ("what is a cat", "revenue grew 4 percent"),
         ("hi", ""), ("a longer question about the weather tomorrow", "rain " * 40), ("q", "cats")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("ce"))


def make_runner(path) -> CrossEncoderRunner:
    return CrossEncoderRunner(ModelConfig(model_dir=str(path), block_size=16), dtype=torch.float32, device="cpu",
                              num_kv_blocks=64)


def score(runner: CrossEncoderRunner, pairs) -> np.ndarray:
    """One engine step with every pair whole, encoded as the API worker encodes them."""
    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    prompts = [e.ids for e in tokenizer.encode_batch(pairs)]
    batch = Batch([ScheduledSeq(EngineRequest(f"r{i}", "w", ids, SamplingParams(max_tokens=1, embed=True)), 0, len(ids))
                   for i, ids in enumerate(prompts)])
    out = runner.execute(batch)
    assert list(out) == [-1] * len(pairs) and [seq for seq, _ in out.embeddings] == batch.sampled_seqs
    return np.stack([row for _, row in out.embeddings])


def test_scores_match_transformers_in_any_batch(model_dir):
    runner = make_runner(model_dir)
    assert (runner.max_model_len, runner.embedding_dim, runner.head.activation) == (MAX_POSITIONS, 0, "sigmoid")
    logits = reference_logits(model_dir, PAIRS)
    together = score(runner, PAIRS)
    assert together.dtype == np.float32 and together.shape == (len(PAIRS), 2)
    assert together[:, 1] == pytest.approx(logits.tolist(), abs=1e-4)
    assert together[:, 0] == pytest.approx(torch.sigmoid(logits).tolist(), abs=1e-5)
    alone = np.concatenate([score(runner, [pair]) for pair in PAIRS])
    assert alone == pytest.approx(together, abs=1e-5)  # padding with other pairs changes nothing


@pytest.mark.parametrize("activation,fn", [("torch.nn.modules.linear.Identity", lambda x: x),
                                           ("torch.nn.modules.activation.Tanh", torch.tanh)])
def test_the_directory_names_the_activation(tmp_path, activation, fn):
    path = save_tiny_cross_encoder(tmp_path, activation=activation)
    scores = score(make_runner(path), PAIRS[:2])
    assert scores[:, 0] == pytest.approx(fn(reference_logits(path, PAIRS[:2])).tolist(), abs=1e-4)


def test_the_layout_reading(tmp_path):
    def write(config: dict, tokenizer_config: dict | None = None):
        (tmp_path / "config.json").write_text(json.dumps(config))
        if tokenizer_config is not None:
            (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        return tmp_path

    classifier = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}
    assert is_cross_encoder(write(classifier))
    assert read_score_head(tmp_path) == ScoreHead("sigmoid", None)
    assert not is_cross_encoder(write({**classifier, "id2label": {"0": "neg", "1": "pos"}}))  # a two-label classifier
    assert not is_cross_encoder(write({"architectures": ["BertForSequenceClassification"]}))  # transformers' default: 2
    assert not is_cross_encoder(write({"architectures": ["LlamaForCausalLM"], "num_labels": 1}))
    assert is_cross_encoder(write({**classifier, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
                                  {"model_max_length": 512}))
    assert read_score_head(tmp_path) == ScoreHead("identity", 512)
    write({**classifier, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Softmax"}},
          {"model_max_length": int(1e30)})
    with pytest.raises(ValueError, match="Softmax"):
        read_score_head(tmp_path)
    assert not is_cross_encoder(tmp_path / "missing")
