"""The `Runner` protocol: what the engine core and build_engine use of a runner (native, transformers, encoder)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import msgspec

from rill.engine_proc.sample.sampler import SamplerOutput
from rill.engine_proc.sched.batch import Batch

if TYPE_CHECKING:  # the manager imports torch and the model's layers; the protocol needs only the name
    from rill.engine_proc.lora.manager import LoRAManager


class RunnerInfo(msgspec.Struct, frozen=True):
    """How a runner runs, chosen once at its construction: the start log and EngineLimits say it."""

    kind: str  # native | transformers | encoder
    attention_backend: str = ""  # cpu | torch | triton; "" where the runner has no paged attention
    compiled_decode: bool = False  # decode steps through torch.compile'd graphs


class KVSize(Protocol):
    num_blocks: int
    num_bytes: int


class Runner(Protocol):
    vocab_size: int
    max_model_len: int
    kv_cache: KVSize  # the paged cache, or the budget that stands in for it (its bytes go to /stats)
    info: RunnerInfo
    lora: LoRAManager | None  # --enable-lora's adapters (the native runner's); None without
    sliding_window: int | None  # the window every layer attends within, whose blocks the scheduler releases
    # (window, sliding layers) of a model with global layers too: the sliding layers' window tables (window_tables.py)
    layer_window: tuple[int, tuple[int, ...]] | None

    def execute(self, batch: Batch) -> SamplerOutput:
        """One engine step: a sampled token id per seq of `batch.sampled_seqs`, in that order."""
        ...

    def close(self) -> None:
        """Stop what the runner started (the tensor-parallel ranks)."""
        ...
