"""Hardening: schemathesis generates requests from OpenAI's own OpenAPI spec (tests/helpers/spec/openai-openapi.yaml)
for the chat, completions and models operations, valid ones and ones that break the schema.

Whatever comes, the answer is never a 5xx; an error is an OpenAI ErrorResponse; a 200 matches the
operation's response schema. Valid-looking requests may well get a 400 (an option this server
refuses, a prompt past the tiny server's 256-token context) or a 404 (another model's name).
Runs on schemathesis' Python API under Hypothesis, derandomized, with bounded example counts.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.helpers.openapi import spec_path, validate
from tests.helpers.responses_events import sse_lines
from tests.helpers.server import TINY_MODEL

# operationId -> the schema of its 200 body
OPERATIONS = {
    "createChatCompletion": "CreateChatCompletionResponse",
    "createCompletion": "CreateCompletionResponse",
    "listModels": "ListModelsResponse",
    "retrieveModel": "Model",
}
MAX_EXAMPLES = {"createChatCompletion": 40, "createCompletion": 40, "listModels": 5, "retrieveModel": 15}


@pytest.fixture(scope="module")
def openai_schema():
    return schemathesis.openapi.from_path(spec_path())


def aimed_at_the_served_model(case, use_served_model: bool):
    """Generated bodies name OpenAI's models: valid ones (and half the others) are pointed at ours,
    so that they get past the 404 to the rest of the checks."""
    if use_served_model:
        if isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = TINY_MODEL
        if case.path_parameters and "model" in case.path_parameters:
            case.path_parameters["model"] = TINY_MODEL
    return case


def check(case, resp, ok_schema: str) -> int:
    """The status, once the answer is known to be right for it."""
    where = f"{case.method} {case.formatted_path} {json.dumps(case.body, default=str)[:300]}"
    assert resp.status_code < 500, f"{where} -> {resp.status_code} {resp.text[:300]}"
    if resp.status_code >= 400:
        validate("ErrorResponse", resp.json())
        return resp.status_code
    assert resp.status_code == 200, f"{where} -> {resp.status_code}"
    if resp.headers["content-type"][0].startswith("text/event-stream"):  # header values come as lists
        events = [line for line in sse_lines(resp.text) if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events[:-1]), where
    else:
        validate(ok_schema, resp.json())
    return 200


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize("operation_id", list(OPERATIONS))
def test_schemathesis_never_gets_a_5xx(tiny_server, openai_schema, operation_id, mode):
    operation = openai_schema.find_operation_by_id(operation_id)
    aim = st.just(True) if mode is GenerationMode.POSITIVE else st.booleans()
    cases = st.builds(aimed_at_the_served_model, operation.as_strategy(generation_mode=mode), aim)
    base_url = f"{tiny_server.base_url}/v1"
    statuses = []

    @settings(max_examples=MAX_EXAMPLES[operation_id], deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(cases)
    def run(case):
        statuses.append(check(case, case.call(base_url=base_url, timeout=60), OPERATIONS[operation_id]))

    run()
    print(f"{operation_id} {mode.value}: {sorted(Counter(statuses).items())}")
    if mode is GenerationMode.POSITIVE:  # some valid requests got all the way through and were served
        assert 200 in statuses
