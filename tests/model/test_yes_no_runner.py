"""YesNoRunner against transformers on a tiny random Qwen3: the last token's "yes" against "no", the same
whatever the batching (left padding), and the refusal of a vocabulary without one-token answers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models

from rill.engine_proc.model.yes_no_runner import YesNoRunner, answer_id
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.config import ModelConfig
from rill.ipc.protocol import SamplingParams
from tests.helpers.tiny_rerankers import reference_yes_no, save_tiny_yes_no_reranker

PROMPTS = ["<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n", "Hi",
           "A much longer prompt about the weather, " * 6, "Does a cat purr? Answer yes or no:"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_yes_no_reranker(tmp_path_factory.mktemp("yes_no"))


def score(runner: YesNoRunner, model_dir, prompts: list[str]) -> np.ndarray:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = [e.ids for e in tokenizer.encode_batch(prompts, add_special_tokens=False)]
    batch = Batch([ScheduledSeq(EngineRequest(f"r{i}", "w", p, SamplingParams(max_tokens=1, embed=True)), 0, len(p))
                   for i, p in enumerate(ids)])
    out = runner.execute(batch)
    assert list(out) == [-1] * len(prompts) and [seq for seq, _ in out.embeddings] == batch.sampled_seqs
    return np.stack([row for _, row in out.embeddings])


def test_margins_match_transformers_in_any_batch(model_dir):
    runner = YesNoRunner(ModelConfig(model_dir=str(model_dir), block_size=16), dtype=torch.float32, device="cpu",
                         num_kv_blocks=64)
    assert (runner.yes_id, runner.no_id, runner.max_model_len) == (10407, 4607, 512)
    margins = reference_yes_no(model_dir, PROMPTS)
    together = score(runner, model_dir, PROMPTS)
    assert together.dtype == np.float32 and together.shape == (len(PROMPTS), 2)
    assert together[:, 1] == pytest.approx(margins.tolist(), abs=1e-4)
    # sigmoid(yes - no) is the softmax over the two logits, Qwen3-Reranker's score
    assert together[:, 0] == pytest.approx(torch.sigmoid(margins).tolist(), abs=1e-5)
    assert np.ptp(together[:, 0]) > 0.05  # the prompts are told apart (the check could fail)
    alone = np.concatenate([score(runner, model_dir, [p]) for p in PROMPTS])
    assert alone == pytest.approx(together, abs=1e-4)  # left padding and positions change nothing


def test_answers_must_be_one_token():
    chars = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("yesno")}, merges=[]))
    with pytest.raises(ValueError, match="'yes' as one token"):
        answer_id(chars, "yes")
    words = Tokenizer(models.WordLevel(vocab={"yes": 0, "no": 1, "[UNK]": 2}, unk_token="[UNK]"))
    assert (answer_id(words, "yes"), answer_id(words, "no")) == (0, 1)
