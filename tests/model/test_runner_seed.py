"""vLLM's --seed (ModelConfig.seed) seeds the runner's sampler: requests without a seed of their own sample alike
from one start to the next (tests/unit/test_vllm_flags.py takes the flag as far as the config)."""
from __future__ import annotations

import torch

from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from tests.helpers.runners import make_runner
from tests.helpers.sampling import make_seq


def test_the_seed_reaches_the_sampler(tiny_model_dir):
    for runner_class in (None, PagedTransformersRunner):
        runner = make_runner(tiny_model_dir, num_kv_blocks=8, eos_token_ids=[2], seed=5, runner_class=runner_class)
        assert runner.sampler._shared_generator.initial_seed() == 5
    # Two starts with the seed draw the same tokens for unseeded requests (without it, 8 draws over a flat-ish
    # distribution of 64 tokens would all agree by chance about once in 10^8).
    logits = torch.randn(8, 64) / 4
    starts = [make_runner(tiny_model_dir, num_kv_blocks=8, eos_token_ids=[2], seed=5) for _ in range(2)]
    draws = [list(r.sampler.sample(logits, [make_seq(temperature=1.0) for _ in range(8)])) for r in starts]
    assert draws[0] == draws[1]
