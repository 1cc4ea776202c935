"""The engine's adapters: names to slots (at most --max-loras), loaded at start or at runtime."""
from __future__ import annotations

import contextlib
import itertools
import logging

import torch

from rill.engine_proc.lora.adapter import ATTENTION, MLP, AdapterError, LoRAAdapter, load_adapter
from rill.engine_proc.lora.layers import LoRAState, wrap_linears

log = logging.getLogger("rill.engine")


class LoRAManager:
    def __init__(self, model, config, max_loras: int, max_rank: int, device, wrap=wrap_linears) -> None:
        """`wrap`: what makes the model's LoRALinears (the native model's, or wrap_transformers_linears)."""
        self.config = config
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.device = device
        self.state = LoRAState()
        self.layers = wrap(model, self.state, max_loras, max_rank, device)
        if not self.layers:
            raise ValueError(f"--enable-lora: model_type {config.model_type!r} has no linear LoRA can target "
                             f"({', '.join(ATTENTION + MLP)} under each layer's self_attn or mlp)")
        self.targets = {(layer.layer, name) for layer in self.layers for name, _, _ in layer.parts}
        # Per layer width, the slot each rank column belongs to: row masks compare against it.
        self.column_slots = {width: (torch.arange(max_loras * width) // width).unsqueeze(0)
                             for width in {layer.width for layer in self.layers}}
        self.slots: dict[str, int] = {}  # adapter name -> its slot
        self.adapters: dict[str, LoRAAdapter] = {}
        self._load_ids = itertools.count(1)

    def load(self, name: str, path: str, *, inplace: bool = False) -> LoRAAdapter:
        """Loads `path` as adapter `name` into a free slot; AdapterError if it cannot be served.

        `inplace` (vLLM's load_inplace): `name` may be loaded already, and the new weights take
        its slot; the caller makes sure no request uses it. The files are read and checked first,
        so a refused load leaves the old adapter as it was.
        """
        replacing = name in self.slots
        if replacing and not inplace:
            raise AdapterError(f"LoRA adapter {name!r} is already loaded")
        if not replacing and len(self.slots) >= self.max_loras:
            raise AdapterError(f"--max-loras {self.max_loras} adapters are loaded already; unload one first")
        adapter = load_adapter(name, path, self.config, self.max_rank)
        if missing := sorted(set(adapter.weights) - self.targets):
            layer, module = missing[0]
            raise AdapterError(f"LoRA adapter {name!r}: layer {layer} has no {module} linear to adapt (a mixture "
                               "of experts' MLP is not served)")
        adapter.load_id = next(self._load_ids)
        slot = self.slots[name] if replacing else min(set(range(self.max_loras)) - set(self.slots.values()))
        try:
            for layer in self.layers:
                layer.set_slot(slot, adapter)
        except BaseException:  # never half loaded: the slot is emptied, the name forgotten
            for layer in self.layers:
                layer.set_slot(slot, None)
            self.slots.pop(name, None)
            self.adapters.pop(name, None)
            raise
        self.slots[name] = slot
        self.adapters[name] = adapter
        log.info("LoRA adapter %s (rank %d, %d modules) %s from %s into slot %d", name, adapter.rank,
                 len(adapter.weights), "replaced in place" if replacing else "loaded", path, slot)
        return adapter

    def unload(self, name: str) -> None:
        slot = self.slots.pop(name, None)
        if slot is None:
            raise AdapterError(f"LoRA adapter {name!r} is not loaded")
        del self.adapters[name]
        for layer in self.layers:
            layer.set_slot(slot, None)
        log.info("LoRA adapter %s unloaded", name)

    @contextlib.contextmanager
    def step_rows(self, batch, flat: bool):
        """The row masks of `batch`'s step while it runs: a flat step keeps the batch's order of token rows, the
        other puts one-token decodes first (engine_proc/attention's prepare)."""
        self.set_rows(batch.seqs if flat else ([s for s in batch.seqs if s.num_new_tokens == 1]
                                               + [s for s in batch.seqs if s.num_new_tokens > 1]))
        try:
            yield
        finally:
            self.clear()

    def set_rows(self, seqs) -> None:
        """The step's row masks, `seqs` (some using an adapter) in the order of their token rows:
        row i keeps columns [slot * width, (slot + 1) * width) of its own slot."""
        slot_of_row = []
        for s in seqs:
            slot_of_row.extend([self.slots[s.req.lora] if s.req.lora else -1] * s.num_new_tokens)
        slots = torch.tensor(slot_of_row).unsqueeze(1)
        self.state.masks = {width: (columns == slots).float().to(self.device)
                            for width, columns in self.column_slots.items()}

    def clear(self) -> None:
        self.state.masks = {}
