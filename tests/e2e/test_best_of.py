"""End to end: OpenAI's legacy `best_of` on completions through the SDK: the `n` answered are the best `n` of the
`best_of` candidates by mean logprob per token (the same candidates a seeded request of n=best_of samples), best
first; usage counts every candidate; streaming and `best_of` < `n` are 400s naming it."""
from __future__ import annotations

import httpx
import pytest

from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"
BODY = {"model": MODEL, "prompt": "Write a name for a pet turtle:", "max_tokens": 12, "temperature": 1.0, "seed": 11}


def mean(choice) -> float:
    lps = choice.logprobs.token_logprobs
    return sum(lps) / len(lps)


def test_the_best_n_of_the_candidates_best_first(client):
    candidates = client.completions.create(**BODY, n=5, logprobs=0)
    best = client.completions.create(**BODY, n=2, logprobs=0, extra_body={"best_of": 5})
    validate("CreateCompletionResponse", best.model_dump(exclude_unset=True))
    ranked = sorted(candidates.choices, key=mean, reverse=True)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1] and mean(best.choices[0]) >= mean(best.choices[1])
    assert best.usage.completion_tokens == candidates.usage.completion_tokens  # every candidate counts
    assert best.usage.prompt_tokens == candidates.usage.prompt_tokens


def test_without_logprobs_none_are_answered(client):
    best = client.completions.create(**BODY, extra_body={"best_of": 3})
    assert len(best.choices) == 1 and best.choices[0].logprobs is None and best.choices[0].text


@pytest.mark.parametrize("extra", [{"best_of": 2, "n": 3}, {"best_of": 3, "stream": True}, {"best_of": 21},
                                   {"best_of": 3, "use_beam_search": True}])
def test_what_best_of_cannot_do_is_a_400_naming_it(server, extra):
    r = httpx.post(f"{server.base_url}/v1/completions", json={**BODY, **extra}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text
