"""The engine's adapters: names to slots (at most --max-loras), loaded at start or at runtime."""
from __future__ import annotations

import logging

import torch

from engine_proc.lora.adapter import AdapterError, LoRAAdapter, load_adapter
from engine_proc.lora.layers import LoRAState, wrap_linears

log = logging.getLogger("rill.engine")


class LoRAManager:
    def __init__(self, model, config, max_loras: int, max_rank: int, dtype: torch.dtype, device) -> None:
        self.config = config
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype, self.device = dtype, device
        self.state = LoRAState()
        self.layers = wrap_linears(model, self.state, max_loras)
        self.slots: dict[str, int] = {}  # adapter name -> its slot
        self.adapters: dict[str, LoRAAdapter] = {}

    def load(self, name: str, path: str) -> LoRAAdapter:
        """Loads `path` as adapter `name` into a free slot; AdapterError if it cannot be served."""
        if name in self.slots:
            raise AdapterError(f"LoRA adapter {name!r} is already loaded")
        if len(self.slots) >= self.max_loras:
            raise AdapterError(f"--max-loras {self.max_loras} adapters are loaded already; unload one first")
        adapter = load_adapter(name, path, self.config, self.max_rank)
        slot = min(set(range(self.max_loras)) - set(self.slots.values()))
        for layer in self.layers:
            layer.set_slot(slot, adapter, self.dtype, self.device)
        self.slots[name] = slot
        self.adapters[name] = adapter
        log.info("LoRA adapter %s (rank %d, %d modules) loaded from %s into slot %d", name, adapter.rank,
                 len(adapter.weights), path, slot)
        return adapter

    def unload(self, name: str) -> None:
        slot = self.slots.pop(name, None)
        if slot is None:
            raise AdapterError(f"LoRA adapter {name!r} is not loaded")
        del self.adapters[name]
        for layer in self.layers:
            layer.set_slot(slot, None, self.dtype, self.device)
        log.info("LoRA adapter %s unloaded", name)

    def set_rows(self, seqs) -> bool:
        """Groups the step's token rows by adapter, `seqs` in the order of their rows; False (and
        no groups) when no seq uses one."""
        rows: dict[int, list[int]] = {}
        first = 0
        for s in seqs:
            if s.req.lora:
                rows.setdefault(self.slots[s.req.lora], []).extend(range(first, first + s.num_new_tokens))
            first += s.num_new_tokens
        self.state.groups = [(slot, torch.tensor(r, dtype=torch.long, device=self.device))
                             for slot, r in rows.items()]
        return bool(rows)

    def clear(self) -> None:
        self.state.groups = []
