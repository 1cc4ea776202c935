"""The msgspec messages that cross the worker <-> engine boundary, and their codecs."""
from __future__ import annotations

import enum

import msgspec

from rill.ipc.images import ImageInputs
from rill.ipc.logprobs import LogprobsPayload


class FinishReason(enum.IntEnum):
    """Why a request ended; the API maps these to OpenAI's `finish_reason` strings."""

    STOP = 1  # eos, a stop token id, or (decided in the worker) a stop string
    LENGTH = 2  # max_tokens or the model's context
    ABORT = 3  # the client went away, the worker aborted it, or the drain timed out (AbortAll)
    ERROR = 4  # the engine could not serve it (for example: context full)
    TIMEOUT = 5  # it ran past --request-timeout (engine arrival to now); its blocks are freed
    CANCELLED = 6  # an Abort with notify: another API worker cancelled it (POST /v1/responses/{id}/cancel)
    NO_ADAPTER = 7  # its LoRA adapter was unloaded after its worker checked the name (a 404)


class StructuredKind(enum.IntEnum):
    """What a StructuredSpec's text is; the engine compiles it into a token-mask grammar."""

    JSON_SCHEMA = 1  # value: a JSON schema, as JSON text
    JSON_OBJECT = 2  # value: "" (any JSON object)
    REGEX = 3  # value: the regular expression
    CHOICE = 4  # value: a JSON list of the allowed strings
    GRAMMAR = 5  # value: an EBNF grammar (GBNF)
    STRUCTURAL_TAG = 6  # value: an xgrammar structural tag, as JSON text (asgi/requests/structural_tags.py)


class StructuredSpec(msgspec.Struct, array_like=True, gc=False):
    """A constraint on a request's output, enforced by a token bitmask in the sampler."""

    kind: StructuredKind
    value: str
    # Where not empty, the grammar starts once the output has written these ids (harmony's final channel,
    # whose header is special tokens a grammar does not write); the output is free until then.
    start_ids: list[int] = []


class ThinkingBudget(msgspec.Struct, array_like=True, gc=False):
    """A thinking budget: after `max_tokens` output tokens of thinking, the engine writes `end_ids` (the
    reasoning parser's `</think>`) itself, and the answer follows (engine_proc/sample/thinking.py)."""

    max_tokens: int
    end_ids: list[int]
    # Where not empty, only an output that opens with these ids is thinking (qwen3: `<think>`); else every
    # output starts in its thinking (deepseek_r1, whose template opens it in the prompt).
    open_ids: list[int] = []
    # Where not empty, what a model writes when it ends its thinking itself, if not all of `end_ids` (harmony:
    # `<|end|>`, after which it may open a call rather than the final answer).
    closed_ids: list[int] = []


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What the engine needs to generate for one request; validated in the API worker."""

    max_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = []
    min_p: float = 0.0  # 0 means off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 means off
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the top k
    logit_bias: dict[int, float] = {}  # token id -> added to its logit before sampling
    allowed_token_ids: list[int] = []  # vLLM's: when set, every other token's logit is -inf
    bad_words_ids: list[list[int]] = []  # vLLM's bad_words as token sequences (engine_proc/sample/bad_words.py)
    structured: StructuredSpec | None = None  # structured outputs (and forced tool calls)
    # None: none; k: each prompt token's logprob (from the first on) and the top k. Such a request
    # computes its whole prompt (the prefix cache does not hide a token it has not scored yet).
    prompt_logprobs: int | None = None
    # An embedding request (POST /v1/embeddings): the prompt's pooled hidden state, sent with its
    # STOP delta (RequestDelta.embedding); nothing is sampled.
    embed: bool = False
    lora: str = ""  # the LoRA adapter the request runs with, by name ("": the base model)
    thinking: ThinkingBudget | None = None  # thinking_token_budget, Anthropic's budget_tokens
    # OpenAI's predicted output (chat's `prediction`), tokenized: the engine drafts from it (engine_proc/spec/prediction.py).
    prediction: list[int] = []
    # The prefix-cache salt (ipc/cache_salt.py): 16 bytes from the API key and the request's `cache_salt`, entering
    # the root of its chain of blocks, so no tenant hits another's; b"": none.
    cache_salt: bytes = b""
    # --scheduling-policy priority: lower runs first (engine_proc/sched/priority.py); 0 under fcfs.
    priority: int = 0
    # A chat request's images (a vision model's): the processor's tensors, whose features replace the prompt's
    # image tokens (ipc/images.py)
    images: ImageInputs | None = None


# Token ids travel inline, as msgpack lists: bench/ipc/ipc_bench.py measured them against ids in a
# shared-memory ring, which cost more for prompts (copying a list into the ring) and the same
# for decode steps; for large arrays (top-k logprobs) raw bytes inline did as well as the ring.

# ---- worker -> engine (one PULL socket on the engine, a PUSH per worker) ----------------


class Submit(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    """One API request: its engine requests (`n` per prompt of a list), admitted or refused together."""

    req_ids: list[str]
    worker_id: str
    params: SamplingParams
    prompts: list[list[int]]  # prompt token ids, sent once per prompt
    # Choices per prompt: req_ids[i * n + j] is prompt i's choice j. With a seed, choice j is
    # seeded seed + j (vLLM's parallel sampling), so choices differ and are reproducible.
    n: int = 1


class Abort(msgspec.Struct, tag=True, array_like=True, gc=False):
    req_ids: list[str]
    # True: the request's own worker did not ask; it gets a CANCELLED delta to end its response.
    notify: bool = False


class Shutdown(msgspec.Struct, tag=True, array_like=True, gc=False):
    pass


class StatsQuery(msgspec.Struct, tag=True, array_like=True, gc=False):
    worker_id: str


class AbortAll(msgspec.Struct, tag=True, array_like=True, gc=False):
    """The launcher's drain ran out of time: end every request now, each with an ABORT delta.
    With a worker id: that API worker died, so end its requests alone."""

    worker_id: str = ""


class LoRAUpdate(msgspec.Struct, tag=True, array_like=True, gc=False):
    """POST /v1/load_lora_adapter (a path) or /v1/unload_lora_adapter (no path), answered by a LoRAResult."""

    worker_id: str
    name: str
    path: str = ""
    # vLLM's load_inplace: a loaded adapter of this name is replaced (once no request uses it).
    load_inplace: bool = False


class CacheReset(msgspec.Struct, tag=True, array_like=True, gc=False):
    """POST /reset_prefix_cache or /flush_cache (--enable-cache-reset): the prefix cache emptied between two steps,
    answered by a CacheResetResult from every engine."""

    worker_id: str


EngineInput = Submit | Abort | Shutdown | StatsQuery | AbortAll | LoRAUpdate | CacheReset


# ---- engine -> worker (a PUSH per worker on the engine, a PULL bound by each worker) -----


class RequestTimings(msgspec.Struct, array_like=True, gc=False):
    """Where a finished request spent its time in the engine, as vLLM splits it (seconds).

    queue: arrival to first scheduled; prefill: first scheduled to first token; decode: first
    token to last token. A preempted request keeps its first times: its recompute counts as decode.
    """

    queue_s: float
    prefill_s: float
    decode_s: float


class RequestDelta(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New tokens of one request in one step. Its ids are `num_new` ids of the step's array."""

    req_id: str
    num_new: int
    finish: FinishReason | None = None
    num_prompt_tokens: int = 0  # set on a request's first delta
    num_cached_tokens: int = 0
    logprobs: LogprobsPayload | None = None  # of its new ids, when the request asked
    # On its first delta, when the request asked: prompt tokens 1..n-1 (token 0 has no logprob).
    prompt_logprobs: LogprobsPayload | None = None
    embedding: bytes | None = None  # an embedding request's vector, little-endian float32, on its last delta
    timings: RequestTimings | None = None  # on the final delta of a request that made a token
    # On the final delta of a request with a prediction: [accepted, rejected] predicted tokens drafted.
    prediction_tokens: list[int] | None = None


class StepOutputs(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    """One message per engine step per worker; token ids of all deltas laid end to end."""

    deltas: list[RequestDelta]
    ids: list[int]
    # The engine's queue after the step, for the workers' choice of engine (--data-parallel-size).
    data_parallel_rank: int = 0
    num_running: int = 0
    num_waiting: int = 0


class EngineStats(msgspec.Struct, tag=True, array_like=True, gc=False):
    """Figures the engine exposes (answered to a StatsQuery)."""

    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    num_aborted: int
    num_finished: int
    # Prefix cache: tokens of the requests admitted, and of those, tokens found cached.
    num_prefix_queries_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    peak_rss_bytes: int = 0  # the engine process's high-water mark of resident memory
    kv_cache_bytes: int = 0  # the KV cache's fixed size, allocated once at start
    num_preemptions: int = 0  # requests sent back to waiting for lack of KV blocks, since start
    num_generated_tokens: int = 0  # tokens sampled since start (the launcher derives tokens/s)
    num_waiting_tokens: int = 0  # tokens the waiting requests have to prefill (prompt, + output if preempted)
    num_rejected: int = 0  # engine requests refused by admission control (a 429), since start
    num_timed_out: int = 0  # engine requests ended by --request-timeout, since start
    num_cached_blocks: int = 0  # blocks the prefix cache indexes now (held or evictable)
    data_parallel_rank: int = 0  # which engine answered (--data-parallel-size)
    # Speculative decoding (--speculative-config), since start: steps' drafts verified, their
    # tokens, those accepted, and accepted by position (one entry per draft position; [] when off).
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []
    # Of those, the tokens structured outputs' grammars forced (--jump-forward-tokens), and those accepted.
    num_jump_forward_tokens: int = 0
    num_jump_forward_accepted: int = 0
    lora_modules: dict[str, str] = {}  # --enable-lora: the adapters loaded now, name -> path
    # A model with sliding and global layers: of the blocks held, those the sliding layers' window
    # tables hold (engine_proc/sched/window_tables.py; 0 for any other model)
    num_window_blocks: int = 0
    rss_bytes: int = 0  # the engine process's resident memory now
    weight_bytes: int = 0  # the model's tensors as loaded (prepacked or quantized), each storage once
    # --scheduling-policy priority: requests running and waiting by the priority they asked for, as
    # {"0": [running, waiting], ...}, at most MAX_PRIORITY_LABELS keys (the rest under "other"); {} under fcfs.
    by_priority: dict[str, list[int]] = {}


class Verdict(enum.IntEnum):
    """The input thread's answer to a Submit under admission control (engine_proc/sched/admission.py)."""

    ADMITTED = 0
    QUEUE_FULL = 1  # --max-queued-requests: the waiting queue has no room for its requests
    QUEUE_TOKENS_FULL = 2  # --max-queued-tokens: nor for its prompt tokens
    # Larger than a bound on its own, so no wait would ever admit it (a 400, not a 429): more
    # engine requests (prompts x n) than --max-num-seqs + --max-queued-requests, or more tokens
    # than --max-queued-tokens. Admission.limit carries that bound.
    TOO_MANY_REQUESTS = 3
    TOO_MANY_TOKENS = 4


class Admission(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    """Sent at once for each Submit, only while a queue bound is set: the worker waits for it
    before its response starts, so a refusal is a 429 and never a broken stream."""

    req_id: str  # the Submit's first req_id
    verdict: Verdict = Verdict.ADMITTED
    retry_after_s: int = 0  # whole seconds, at least 1 on a refusal
    limit: int = 0  # TOO_MANY_*: the bound the Submit passes on its own


class LoRAResult(msgspec.Struct, tag=True, array_like=True, gc=False):
    name: str
    error: str = ""  # "": done
    status: int = 200  # the HTTP status of the error: 400, or 404 for an adapter not loaded
    data_parallel_rank: int = 0  # the engine that answers (--data-parallel-size: every engine does)


class CacheResetResult(msgspec.Struct, tag=True, array_like=True, gc=False):
    data_parallel_rank: int
    num_blocks: int  # the blocks the prefix cache indexed, now forgotten; -1: the reset failed (see the engine's log)


EngineOutput = StepOutputs | EngineStats | Admission | LoRAResult | CacheResetResult


class EngineLimits(msgspec.Struct):
    """Carried by the READY handshake: what the engine can actually serve."""

    model_id: str
    model_dir: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_kv_blocks: int
    block_size: int
    eos_token_ids: list[int]
    vocab_size: int
    dtype: str
    # Admission control (engine_proc/sched/admission.py); 0 is no limit. With either bound set the
    # engine answers every Submit with an Admission, which the workers wait for.
    max_queued_requests: int = 0
    max_queued_tokens: int = 0
    request_timeout_s: float = 0.0
    quantization: str = "none"  # --quantization: none | int8
    dtype_reason: str = ""  # why --dtype auto chose `dtype` (engine_proc/cpu_features.py)
    cpu: str = ""  # the CPU model and the flags that decide fast paths
    compiled_decode: bool = False  # decode steps run through torch.compile (engine_proc/model/decode_graphs.py)
    attention_backend: str = ""  # the one chosen: cpu | torch | triton ("" for the transformers runner)
    generates: bool = True  # False: an embedding model (an encoder), which serves /v1/embeddings only
    embedding_dim: int = 0  # the vectors' size; 0: no embeddings (a decoder without --enable-embeddings)
    # What scores pairs for /rerank and /score (asgi/routes/rerank.py), or texts for /classify, which are then the
    # only routes served: "" none | cross-encoder | yes-no (a decoder reranker, --task score) | classify.
    scorer: str = ""
    labels: list[str] = []  # a classifier's (scorer "classify"): id2label in the logits' order, for /classify
    scheduling_policy: str = "fcfs"  # --scheduling-policy: "priority" honours a request's `priority`
    lora_modules: dict[str, str] = {}  # --enable-lora: the adapters loaded at start, name -> path
    speculative: str = ""  # --speculative-config as the engine runs it ("" off), e.g. "ngram k=4 n=2..5"
    kv_cache_dtype: str = ""  # what the KV cache holds: int8 (--kv-cache-dtype int8) or the model's dtype


input_encoder = msgspec.msgpack.Encoder()
input_decoder = msgspec.msgpack.Decoder(EngineInput)
output_encoder = msgspec.msgpack.Encoder()
output_decoder = msgspec.msgpack.Decoder(EngineOutput)
