"""ClassifierRunner against transformers on tiny random-weight sequence classifiers (a cross-encoder, a BERT of
three labels, a Llama with a score head): the same scores whatever the batching, each activation, and the
directory reading that picks them."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from rill.engine_proc.model.classifier_runner import ClassifierRunner
from rill.engine_proc.model.cross_encoder_layout import ScoreHead, is_cross_encoder, read_score_head
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.config import ModelConfig
from rill.ipc.protocol import SamplingParams
from tests.helpers.tiny_classifiers import (
    LABELS,
    reference_class_logits,
    save_tiny_decoder_classifier,
    save_tiny_text_classifier,
)
from tests.helpers.tiny_rerankers import MAX_POSITIONS, minilm_dir, reference_logits, save_tiny_cross_encoder

PAIRS = [("what is a cat", "a cat is a small feline"), ("what is a cat", "revenue grew 4 percent"),
         ("hi", ""), ("a longer question about the weather tomorrow", "rain " * 40), ("q", "cats")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("ce"))


def make_runner(path, pairs: bool = True) -> ClassifierRunner:
    return ClassifierRunner(ModelConfig(model_dir=str(path), block_size=16), dtype=torch.float32, device="cpu",
                            num_kv_blocks=64, pairs=pairs)


def score(runner: ClassifierRunner, pairs, tokenizer_dir=None) -> np.ndarray:
    """One engine step with every pair (or text) whole, encoded as the API worker encodes them."""
    tokenizer = Tokenizer.from_file(str((tokenizer_dir or minilm_dir()) / "tokenizer.json"))
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
    assert read_score_head(tmp_path) == ScoreHead("sigmoid", None, ("LABEL_0",))
    assert not is_cross_encoder(write({**classifier, "id2label": {"0": "neg", "1": "pos"}}))  # a two-label classifier
    assert not is_cross_encoder(write({"architectures": ["BertForSequenceClassification"]}))  # transformers' default: 2
    assert not is_cross_encoder(write({"architectures": ["LlamaForCausalLM"], "num_labels": 1}))
    assert is_cross_encoder(write({**classifier, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
                                  {"model_max_length": 512}))
    assert read_score_head(tmp_path) == ScoreHead("identity", 512, ("LABEL_0",))
    write({**classifier, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Softmax"}},
          {"model_max_length": int(1e30)})
    with pytest.raises(ValueError, match="Softmax"):
        read_score_head(tmp_path)
    assert not is_cross_encoder(tmp_path / "missing")

    two = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "neg", "1": "pos"}}
    write(two)
    assert read_score_head(tmp_path) == ScoreHead("softmax", None, ("neg", "pos"))
    write({**two, "problem_type": "multi_label_classification"})
    assert read_score_head(tmp_path).activation == "sigmoid"
    write({**two, "problem_type": "regression"})
    assert read_score_head(tmp_path).activation == "identity"
    write({"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 3})  # no id2label: transformers' names
    assert read_score_head(tmp_path).labels == ("LABEL_0", "LABEL_1", "LABEL_2")


TEXTS = ["I loved every minute of it", "terrible", "", "a much longer text about the weather " * 6, "ok"]


@pytest.mark.parametrize("problem_type,activate", [(None, lambda x: torch.softmax(x, dim=-1)),
                                                   ("multi_label_classification", torch.sigmoid)])
def test_a_text_classifier_matches_transformers(tmp_path, problem_type, activate):
    path = save_tiny_text_classifier(tmp_path, problem_type)
    runner = make_runner(path, pairs=False)
    assert runner.head.labels == LABELS
    logits = reference_class_logits(path, TEXTS)
    together = score(runner, TEXTS)
    assert together.shape == (len(TEXTS), 2 * len(LABELS))
    assert together[:, 3:] == pytest.approx(logits.numpy(), abs=1e-4)
    assert together[:, :3] == pytest.approx(activate(logits).numpy(), abs=1e-5)
    assert np.ptp(together[:, 3:], axis=0).max() > 0.1  # the texts are told apart (the check could fail)


def test_the_one_texts_token_types_are_zero_even_with_a_separator_inside(tmp_path):
    """A text holding "[SEP]" is one segment to a classifier, as transformers tokenizes one text."""
    path = save_tiny_text_classifier(tmp_path)
    text = "before [SEP] after"
    assert score(make_runner(path, pairs=False), [text])[0, 3:] == pytest.approx(
        reference_class_logits(path, [text])[0].numpy(), abs=1e-4)


@pytest.mark.parametrize("num_labels", [2, 1])
def test_a_decoder_classifier_reads_each_prompts_last_token(tmp_path, num_labels):
    """Batched right-padded prompts of several lengths against transformers' forward of each alone (which
    needs no pad token for one); without a pad token transformers itself refuses such a batch."""
    path = save_tiny_decoder_classifier(tmp_path, num_labels)
    texts = [t for t in TEXTS if t]
    runner = make_runner(path, pairs=False)
    got = score(runner, texts, tokenizer_dir=path)
    logits = reference_class_logits(path, texts)
    assert got[:, num_labels:] == pytest.approx(logits.numpy(), abs=1e-4)
    expected = torch.sigmoid(logits) if num_labels == 1 else torch.softmax(logits, dim=-1)
    assert got[:, :num_labels] == pytest.approx(expected.numpy(), abs=1e-5)
    assert np.ptp(got[:, num_labels:], axis=0).max() > 0.05
