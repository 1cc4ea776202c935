"""The states of layers that keep one per sequence instead of keys and values (linear attention, Mamba), on the paged
transformers route: a slot a request in each layer's pools, as vLLM keeps its Mamba states.

Each layer has a pool of convolution inputs [slots, channels, kernel] and, where it has one, of recurrent states
[slots, ...]. Row 0 is a scratch slot for a compiled step's padding rows; the pools start at FIRST_SLOTS rows and
double when full. A pool is made at start where the layer's shapes are known (layers with a compiled decode step),
else at the first state the layer hands over. A request's slot is zeroed at its first prompt token (a preempted
request recomputes from there), carried over from chunk to chunk and step to step, and given back when the request
is gone. `SlotStates` answers the cache calls such a layer makes, as transformers' own cache does
(`cache_utils.LinearAttentionLayer`), over one request's slot or a decode step's slots gathered.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from rill.engine_proc.sched.batch import Batch

FIRST_SLOTS = 8  # the pools' rows at start, the scratch slot's included


class LinearStates:
    """Every state layer's pools (`conv`, `recurrent`: layer index -> [slots, ...]) and each running request's slot,
    kept while the request lives (a weak key: its slot goes back when it is gone)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.compiled = False  # every state layer with a decode step written for Inductor (hf_linear_attention.py)
        self.conv: dict[int, torch.Tensor] = {}
        self.recurrent: dict[int, torch.Tensor] = {}
        self.capacity = FIRST_SLOTS
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._free = list(range(FIRST_SLOTS - 1, 0, -1))

    def make(self, kind: str, layer: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zeroed pool of `kind` ("conv" or "recurrent") for `layer`, each slot of `shape`. Inference tensors, as the
        steps (in inference mode) grow them: a compiled step's inputs keep one kind."""
        with torch.inference_mode():
            pool = torch.zeros(self.capacity, *shape, dtype=dtype, device=self.device)
        getattr(self, kind)[layer] = pool
        return pool

    def begin_step(self, batch: Batch) -> None:
        """Each sequence's slot at its position: zeroed at its first token, else where its last step left it (a
        ValueError if not: a step this runner did not see); then the position the step leaves it at."""
        for seq in batch.seqs:
            slot = self._slots.get(seq.req)
            if slot is None:
                slot = self._slots[seq.req] = self._take()
                weakref.finalize(seq.req, self._give_back, slot.index)
            if seq.start_pos == 0:
                for pool in (*self.conv.values(), *self.recurrent.values()):
                    pool[slot.index].zero_()
            elif slot.position != seq.start_pos:
                raise ValueError(f"request {seq.req.req_id}: its linear-attention states are at position "
                                 f"{slot.position}, not {seq.start_pos} (they cannot be rewound or shared)")
            slot.position = seq.start_pos + seq.num_new_tokens

    def slot(self, req) -> int:
        return self._slots[req].index

    def slots(self, batch: Batch, rows: int) -> torch.Tensor:
        """[rows] the slot of each sequence of a decode-only step, in its order; padding rows the scratch slot 0."""
        slots = torch.zeros(rows, dtype=torch.long)
        slots[:len(batch.seqs)] = torch.tensor([self._slots[s.req].index for s in batch.seqs], dtype=torch.long)
        return slots

    def of_slot(self, layer: int, slot: int) -> SlotStates:
        """One request's states in `layer`: views of its slot, which the layer's updates land in."""
        views = (None if pool is None else pool[slot:slot + 1] for pool in (self.conv.get(layer),
                                                                              self.recurrent.get(layer)))
        return SlotStates(*views, make=lambda kind, shape, dtype: self.make(kind, layer, shape, dtype)[slot:slot + 1])

    def gather(self, layer: int, slots: torch.Tensor) -> SlotStates:
        """The states of the sequences in `slots` as one batch's (copies: scatter puts them back)."""
        return SlotStates(*(None if pool is None else pool.index_select(0, slots)
                            for pool in (self.conv.get(layer), self.recurrent.get(layer))))

    def scatter(self, layer: int, slots: torch.Tensor, gathered: SlotStates) -> None:
        for pool, states in ((self.conv.get(layer), gathered.conv), (self.recurrent.get(layer), gathered.recurrent)):
            if pool is not None:
                pool.index_copy_(0, slots, states)

    def _give_back(self, index: int) -> None:
        self._free.append(index)  # the list of now: growing makes a new one

    def _take(self) -> _Slot:
        if not self._free:  # twice the slots, the states kept
            old, self.capacity = self.capacity, 2 * self.capacity
            for pools in (self.conv, self.recurrent):
                for layer, pool in pools.items():
                    pools[layer] = torch.cat([pool, torch.zeros_like(pool)])
            self._free = list(range(2 * old - 1, old - 1, -1))
        return _Slot(self._free.pop())


class _Slot:
    __slots__ = ("index", "position")

    def __init__(self, index: int) -> None:
        self.index, self.position = index, 0


class SlotStates:
    """A layer's convolution inputs [rows, channels, kernel] and recurrent states [rows, ...] as transformers' cache
    serves them to it (None before the layer's first state: `make` then makes its pool and gives the slot's view)."""

    def __init__(self, conv: torch.Tensor | None, recurrent: torch.Tensor | None, make=None) -> None:
        self.conv, self.recurrent, self._make = conv, recurrent, make

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        _one_state(state_idx)
        return self.conv  # a decode step's convolution updates it in place

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        _one_state(state_idx)
        return self.recurrent

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        pass

    def get_recurrent_states_to_keep(self, layer_idx: int) -> int:
        return 0

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                          conv_kernel_size: int | None = None, **kwargs) -> torch.Tensor:
        """The inputs the convolution sees (the kept ones, then the new: zeros before a request's first); keeps the
        last kernel-size of them."""
        _one_state(state_idx)
        if self.conv is None:  # the layer's first state: as transformers' cache starts one
            kernel = conv_kernel_size or conv_states.shape[-1]
            full = F.pad(conv_states, (max(0, kernel - conv_states.shape[-1]), 0))
            self.conv = self._make("conv", (*conv_states.shape[1:-1], kernel), conv_states.dtype)
        else:
            full = torch.cat([self.conv, conv_states.to(self.conv.dtype)], dim=-1)
        self.conv.copy_(full[..., -self.conv.shape[-1]:])
        return full

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs) -> torch.Tensor:
        _one_state(state_idx)
        last = recurrent_states if isinstance(recurrent_states, torch.Tensor) else recurrent_states[-1]
        if self.recurrent is None:
            self.recurrent = self._make("recurrent", tuple(last.shape[1:]), last.dtype)
        self.recurrent.copy_(last)
        return last


def _one_state(state_idx: int) -> None:
    if state_idx:  # Kimi Linear's several states a layer: not served (paged_unsupported lists the families served)
        raise NotImplementedError("a layer with more than one state of a kind")


def conv_step(conv1d: torch.nn.Conv1d, conv: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal depthwise convolution's decode for one input of each row, as transformers' `causal_conv1d_update`
    (the decode steps written for Inductor: gated_deltanet.py, mamba2.py): conv [rows, channels, kernel] the kept
    inputs, new [rows, channels]; the output before the activation and the new kept inputs."""
    weight = conv1d.weight[:, 0]
    window = torch.cat([conv[..., 1:], new.to(conv.dtype)[..., None]], dim=-1)
    out = (window.to(weight.dtype) * weight).sum(-1)
    return (out if conv1d.bias is None else out + conv1d.bias), window

