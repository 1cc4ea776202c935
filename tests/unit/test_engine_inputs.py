"""The busy loop's input handling around a real scheduler (no model, no sockets): an input whose
handling raises fails alone, a LoRA admin call that raises gets a 500 answer, a prompt id outside
the vocabulary ends its own request, and admission refuses a Submit larger than a bound on its own."""
from __future__ import annotations

import queue

from rill.engine_proc.core import EngineCore
from rill.engine_proc.io_threads import InputThread
from rill.engine_proc.lora.adapter import AdapterError
from rill.engine_proc.sched.admission import AdmissionControl
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc import protocol as p

VOCAB_SIZE = 100


class FakeAdapter:
    def __init__(self, load_id: int) -> None:
        self.load_id = load_id
        self.path = "/adapters/x"


class FakeLoRA:
    """The LoRAManager's interface; `load` raises what the test puts in `raises`."""

    def __init__(self) -> None:
        self.slots: dict[str, int] = {}
        self.adapters: dict[str, FakeAdapter] = {}
        self.raises: BaseException | None = None
        self.num_loads = 0

    def load(self, name: str, path: str, *, inplace: bool = False) -> None:
        if self.raises is not None:
            raise self.raises
        if name in self.slots and not inplace:
            raise AdapterError(f"LoRA adapter {name!r} is already loaded")
        self.num_loads += 1
        self.slots[name] = 0
        self.adapters[name] = FakeAdapter(self.num_loads)

    def unload(self, name: str) -> None:
        del self.slots[name], self.adapters[name]


class Runner:
    kv_cache = type("KVCache", (), {"num_bytes": 0})
    vocab_size = VOCAB_SIZE

    def __init__(self) -> None:
        self.lora = FakeLoRA()


class ExplodingGate:
    def admit(self, req):
        raise RuntimeError("a bug in the grammar gate")


def engine() -> tuple[EngineCore, list]:
    scheduler = Scheduler(BlockManager(64, 4, enable_prefix_caching=True), max_num_seqs=8,
                          max_num_batched_tokens=64, max_model_len=64, eos_token_ids=[0])
    published: list = []
    return EngineCore(scheduler, Runner(), queue.SimpleQueue(), published.append), published


def request(req_id: str, prompt=(1, 2, 3), **params) -> EngineRequest:
    return EngineRequest(req_id, "w1", list(prompt), p.SamplingParams(max_tokens=4, **params))


def finishes(published: list) -> dict[str, p.FinishReason]:
    return {d.req_id: d.finish for item in published if isinstance(item, list) for _, d, _ in item}


def test_a_request_whose_handling_raises_ends_alone_and_the_loop_goes_on():
    core, published = engine()
    core.grammar_gate = ExplodingGate()
    core.handle(request("ok"))
    core.handle(request("bad", structured=p.StructuredSpec(p.StructuredKind.REGEX, "a+")))
    core.handle(request("after"))
    assert finishes(published) == {"bad": p.FinishReason.ERROR}
    assert core.scheduler.live_req_ids() == ["ok", "after"]


def test_a_prompt_id_outside_the_vocabulary_ends_its_own_request():
    core, published = engine()
    for req_id, prompt in (("neg", [1, -1]), ("big", [VOCAB_SIZE]), ("ok", [VOCAB_SIZE - 1, 0])):
        core.handle(request(req_id, prompt))
    assert finishes(published) == {"neg": p.FinishReason.ERROR, "big": p.FinishReason.ERROR}
    assert core.scheduler.live_req_ids() == ["ok"]


def test_a_lora_load_that_raises_anything_is_answered_and_the_engine_goes_on():
    core, published = engine()
    core.runner.lora.raises = MemoryError("the adapter is too large")  # not an AdapterError
    core.handle(p.LoRAUpdate("w1", "x", "/adapters/x"))
    core.runner.lora.raises = AdapterError("LoRA adapter 'y': bad")
    core.handle(p.LoRAUpdate("w1", "y", "/adapters/y"))
    (_, failed), (_, refused) = published
    assert failed.status == 500 and "load LoRA adapter 'x'" in failed.error
    assert refused.status == 400 and refused.error == "LoRA adapter 'y': bad"
    core.handle(p.StatsQuery("w1"))  # still answering
    assert isinstance(published[-1][1], p.EngineStats)


def test_load_inplace_replaces_an_idle_adapter_with_a_new_load_id_and_refuses_a_busy_one():
    core, published = engine()
    lora = core.runner.lora
    core.handle(p.LoRAUpdate("w1", "x", "/adapters/x"))
    again = p.LoRAUpdate("w1", "x", "/adapters/x2")
    core.handle(again)
    assert published[-1][1].status == 400 and "already loaded" in published[-1][1].error
    core.handle(request("r", lora="x"))
    assert core.scheduler.live_requests()[0].lora_load_id == 1
    core.handle(p.LoRAUpdate("w1", "x", "/adapters/x2", load_inplace=True))
    assert published[-1][1].status == 400 and "replace it in place once they end" in published[-1][1].error
    core.handle(p.Abort(["r"]))
    core.handle(p.LoRAUpdate("w1", "x", "/adapters/x2", load_inplace=True))
    assert published[-1][1].error == "" and lora.adapters["x"].load_id == 2
    core.handle(request("s", lora="x"))
    assert core.scheduler.live_requests()[0].lora_load_id == 2


def test_a_submit_larger_than_a_bound_is_answered_with_that_bound_and_never_queued():
    admission = AdmissionControl(max_queued_requests=1, max_queued_tokens=50, max_num_seqs=2)
    inputs: queue.SimpleQueue = queue.SimpleQueue()
    answers: list = []
    thread = InputThread.__new__(InputThread)  # its socket is not needed to judge a Submit
    thread.inputs, thread.admission, thread.publish = inputs, admission, answers.append
    params = p.SamplingParams(max_tokens=4)
    thread.submit(p.Submit(["a", "b", "c", "d"], "w1", params, [[1] * 5, [2] * 5], n=2))  # 4 > 2 seats + 1 queued
    thread.submit(p.Submit(["e"], "w1", params, [[1] * 51]))  # 51 tokens > 50
    thread.submit(p.Submit(["f"], "w1", params, [[1] * 50]))
    got = [p.output_decoder.decode(p.output_encoder.encode(a)) for _, a in answers]  # over the wire
    assert [(a.verdict, a.limit) for a in got] == [(p.Verdict.TOO_MANY_REQUESTS, 3), (p.Verdict.TOO_MANY_TOKENS, 50),
                                                   (p.Verdict.ADMITTED, 0)]
    assert inputs.qsize() == 1 and admission.num_rejected == 5
