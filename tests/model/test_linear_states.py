"""State layers' states on the paged transformers route (engine_proc/model/linear_states.py): a slot a request in pools
that grow with the requests running at once, zeroed at a request's first token, kept across steps, given back when the
request is gone. (The route's tests check the states' use against transformers' logits.)"""
from __future__ import annotations

import gc

import pytest
import torch

from rill.engine_proc.model import gated_deltanet
from rill.engine_proc.model.linear_states import FIRST_SLOTS, LinearStates
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.tiny_models import tiny_config


@pytest.fixture
def states() -> LinearStates:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    config = tiny_config("qwen3_5_text")
    states = LinearStates(torch.device("cpu"))
    for i, kind in enumerate(config.layer_types):
        if kind == "linear_attention":
            gated_deltanet.prepare(Qwen3_5GatedDeltaNet(config, i), states)
    return states


def _request(name: str) -> EngineRequest:
    return EngineRequest(name, "w", [1, 2, 3, 4], SamplingParams(max_tokens=4))


@torch.inference_mode()  # as the runner's steps
def _step(states: LinearStates, seqs: list[tuple[EngineRequest, int, int]]) -> None:
    states.begin_step(Batch([ScheduledSeq(req, start, num) for req, start, num in seqs]))


@torch.inference_mode()
def _fill(states: LinearStates, slot: int, value: float) -> None:
    for pool in (*states.conv.values(), *states.recurrent.values()):
        pool[slot] = value


def _held(states: LinearStates, slot: int) -> set[float]:
    return {float(v) for pool in (*states.conv.values(), *states.recurrent.values()) for v in pool[slot].unique()}


def test_the_pools_grow_with_the_requests_running_at_once_and_keep_their_states(states):
    first = [_request(f"r{i}") for i in range(FIRST_SLOTS - 1)]  # every slot but the scratch slot 0
    _step(states, [(req, 0, 4) for req in first])
    slots = [states.slot(req) for req in first]
    assert sorted(slots) == list(range(1, FIRST_SLOTS)) and states.capacity == FIRST_SLOTS
    for slot in slots:
        _fill(states, slot, float(slot))
    more = [_request(f"s{i}") for i in range(3)]
    _step(states, [(req, 4, 1) for req in first] + [(req, 0, 4) for req in more])
    assert states.capacity == 2 * FIRST_SLOTS
    for req, slot in zip(first, slots):  # where they were, as they were
        assert states.slot(req) == slot and _held(states, slot) == {float(slot)}
    new = [states.slot(req) for req in more]
    assert len(set(new) | set(slots) | {0}) == len(new) + len(slots) + 1
    assert all(_held(states, slot) == {0.0} for slot in new)
    # A request from before the pools grew gives its slot back too
    gone = slots[0]
    del first[0], req
    gc.collect()
    free = 2 * FIRST_SLOTS - len(slots) - len(more) - 1  # those never taken, then the one given back
    later = [_request(f"t{i}") for i in range(free + 1)]
    _step(states, [(req, 0, 4) for req in later])
    assert states.capacity == 2 * FIRST_SLOTS and gone in {states.slot(req) for req in later}


def test_a_requests_slot_goes_back_when_it_is_gone_and_starts_at_zero_again(states):
    gone = _request("gone")
    _step(states, [(gone, 0, 4)])
    slot = states.slot(gone)
    _fill(states, slot, 7.0)
    del gone
    gc.collect()
    taken = _request("next")
    _step(states, [(taken, 0, 4)])
    assert states.slot(taken) == slot and _held(states, slot) == {0.0}


def test_a_step_at_another_position_than_the_last_left_is_refused(states):
    req = _request("a")
    _step(states, [(req, 0, 4)])
    _step(states, [(req, 4, 1)])
    with pytest.raises(ValueError, match="request a: its linear-attention states are at position 5, not 4"):
        _step(states, [(req, 4, 1)])
    _step(states, [(req, 0, 5)])  # a recompute (after preemption) starts over
