"""The engine's speculator from `--speculative-config`, checked against the runner it serves."""
from __future__ import annotations

import logging

from rill.engine_proc.spec.config import SpeculativeConfig, parse_speculative_config
from rill.engine_proc.spec.ngram import NgramProposer
from rill.engine_proc.spec.speculator import Speculator

log = logging.getLogger("rill.engine")


def build_speculator(text: str, runner, jump_forward_tokens: int = 8) -> tuple[Speculator | None, str]:
    """(the speculator, what /stats says of it). With no config, the speculator of a runner that verifies drafts
    (the native one, the paged transformers route) drafts only from predicted outputs (engine_proc/spec/prediction.py)
    and grammars (jump-forward), and other runners have none. A draft model is the native runner's own
    (engine_proc/model/runner.py builds it beside its model)."""
    config = parse_speculative_config(text)
    verifies = getattr(runner, "verifies_drafts", False)
    if config is None:
        return (Speculator(None, 0, jump_forward_tokens=jump_forward_tokens) if verifies else None), ""
    if not verifies and getattr(runner, "linear_states", None) is not None:
        raise ValueError("--speculative-config is not served for a model with linear-attention layers (Qwen3.5): "
                         "their states cannot be rewound past a refused draft")
    if not verifies:
        raise ValueError("--speculative-config needs the native runner or the paged transformers route "
                         "(a model run one sequence at a time verifies no drafts)")
    if config.method == "draft_model" and runner.info.kind != "native":
        raise ValueError("--speculative-config's draft_model needs the native runner (a Llama-family model)")
    if config.method == "ngram":
        proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
    else:
        proposer = runner.drafter
    speculative = describe(config)
    log.info("speculative decoding: %s", speculative)
    return Speculator(proposer, config.num_speculative_tokens, config.disable_by_batch_size,
                      jump_forward_tokens=jump_forward_tokens), speculative


def describe(config: SpeculativeConfig) -> str:
    if config.method == "ngram":
        text = f"ngram k={config.num_speculative_tokens} n={config.prompt_lookup_min}..{config.prompt_lookup_max}"
    else:
        text = f"draft_model {config.model} k={config.num_speculative_tokens}"
    if config.disable_by_batch_size:
        text += f", off above {config.disable_by_batch_size} running"
    return text
