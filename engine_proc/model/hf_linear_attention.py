"""Linear-attention layers on the paged transformers route: Qwen3.5's and Qwen3-Next's Gated DeltaNet, whose layers
keep a state per sequence (a causal convolution's last inputs and a recurrent matrix) instead of keys and values.

Each request holds a slot in every such layer's pools of states (`LinearStates`), as vLLM keeps its Mamba states:
the pools' row 0 is a scratch slot for a compiled step's padding rows, and they grow as more requests run at once. A
request's states start at zero at its first prompt token (a preempted request recomputes from there) and carry over
from chunk to chunk and step to step; its slot goes back when the request is gone.

The step's sequences go through the model as one row of tokens (hf_attention.py); such a layer would run them as one
sequence. So each of these layers runs its own transformers forward on each prompt chunk of the step alone, over its
request's slot (a `SlotStates`, which answers the cache calls the layer makes as transformers' own cache does:
`cache_utils.LinearAttentionLayer`), and on the step's decodes together, their states gathered from the pools as one
batch's and scattered back after. The decode rows are plain tensor indexing, so the compiled decode steps
(decode_graphs.py) trace them with the rest of the model, the slots and pools their inputs. A state cannot be rewound
or shared, so these models are served without prefix caching or drafts (hf_paged.py, main.py).
"""
from __future__ import annotations

import types
import weakref

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from rill.engine_proc.attention.masked import start_rows
from rill.engine_proc.model.hf_attention import current_step
from rill.engine_proc.sched.batch import Batch

# Families whose linear layers this runs, by the text model's model_type (the classes' forward takes `cache`)
LINEAR_ATTENTION_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
LINEAR_LAYER_TYPE = "linear_attention"
FIRST_SLOTS = 8  # the pools' rows at start, the scratch slot's included; they double when full


def has_linear_attention(config) -> bool:
    return config.model_type in LINEAR_ATTENTION_MODEL_TYPES and \
        LINEAR_LAYER_TYPE in (getattr(config, "layer_types", None) or ())


class SlotStates:
    """Convolution inputs [rows, channels, kernel] and recurrent states [rows, heads, key dim, value dim] of a layer,
    as transformers' cache serves them to it: one request's slot of the pools (views: the layer's updates land in
    them), or a decode step's slots gathered (its caller scatters them back)."""

    def __init__(self, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        self.conv, self.recurrent = conv, recurrent

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.conv  # a decode step's convolution updates it in place

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.recurrent

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        pass

    def get_recurrent_states_to_keep(self, layer_idx: int) -> int:
        return 0

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """The inputs the convolution sees (the kept ones, then the new); keeps the last kernel-size of them."""
        full = torch.cat([self.conv, conv_states.to(self.conv.dtype)], dim=-1)
        self.conv.copy_(full[..., -self.conv.shape[-1]:])
        return full

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs) -> torch.Tensor:
        last = recurrent_states if isinstance(recurrent_states, torch.Tensor) else recurrent_states[-1]
        self.recurrent.copy_(last)
        return last


class _Slot:
    __slots__ = ("index", "position")

    def __init__(self, index: int) -> None:
        self.index, self.position = index, 0


class LinearStates:
    """Every linear layer's pools of states, a slot a running request (row 0 the scratch slot), kept while the request
    lives (a weak key: its slot goes back when it is gone)."""

    def __init__(self, layers: list[torch.nn.Module], dtype: torch.dtype, device: torch.device) -> None:
        self.pools: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * (1 + max(m.layer_idx for m in layers))
        # Inference tensors, as the steps (in inference mode) grow them: a compiled step's inputs keep one kind
        with torch.inference_mode():
            for m in layers:  # the convolution's inputs in the model's dtype, the recurrent state in float32
                conv = torch.zeros(FIRST_SLOTS, m.conv_dim, m.conv_kernel_size, dtype=dtype, device=device)
                recurrent = torch.zeros(FIRST_SLOTS, m.num_v_heads, m.head_k_dim, m.head_v_dim, device=device)
                self.pools[m.layer_idx] = (conv, recurrent)
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._free = list(range(FIRST_SLOTS - 1, 0, -1))

    @property
    def capacity(self) -> int:
        return next(p for p in self.pools if p is not None)[0].shape[0]

    def begin_step(self, batch: Batch) -> None:
        """Each sequence's slot at its position: zeroed at its first token, else where its last step left it (a
        ValueError if not: a step this runner did not see); then the position the step leaves it at."""
        for seq in batch.seqs:
            slot = self._slots.get(seq.req)
            if slot is None:
                slot = self._slots[seq.req] = self._take()
                weakref.finalize(seq.req, self._free.append, slot.index)
            if seq.start_pos == 0:
                for pool in self.pools:
                    if pool is not None:
                        pool[0][slot.index].zero_()
                        pool[1][slot.index].zero_()
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

    def _take(self) -> _Slot:
        if not self._free:  # twice the slots, the states kept
            old = self.capacity
            self.pools = [None if p is None else tuple(torch.cat([t, torch.zeros_like(t)]) for t in p)
                          for p in self.pools]
            self._free = list(range(2 * old - 1, old - 1, -1))
        return _Slot(self._free.pop())


def install_linear_attention(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> LinearStates | None:
    """Runs each linear-attention layer of `model` per sequence of a step (its decodes together) over the states'
    pools; None if it has no such layer."""
    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    if not layers:
        return None
    states = LinearStates(layers, dtype, device)
    for layer in layers:
        if hasattr(layer, "in_proj_b"):  # Qwen3.5's b and a in one projection for decode_step (a copy: they are small)
            ba = torch.cat([layer.in_proj_b.weight, layer.in_proj_a.weight])
            layer.rill_in_proj_ba = torch.nn.Linear(ba.shape[1], ba.shape[0], bias=False, device=ba.device,
                                                    dtype=ba.dtype).requires_grad_(False)
            layer.rill_in_proj_ba.weight.copy_(ba)
        layer.forward = types.MethodType(_per_sequence(type(layer).forward, states), layer)
    return states


def decode_rows(layer: torch.nn.Module, hidden_states: torch.Tensor, slots: torch.Tensor,
                pools: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[rows, hidden]: one token each of the sequences in `slots`, their states gathered from the pools, advanced by
    one token (decode_step), scattered back."""
    conv_pool, recurrent_pool = pools
    # A compiled step's rows: two unknown sizes, one number, not 0 (Qwen3-Next's reshapes divide by it)
    torch._check(slots.shape[0] == hidden_states.shape[0])
    torch._check(hidden_states.shape[0] > 0)
    out, conv, recurrent = decode_step(layer, hidden_states, conv_pool.index_select(0, slots),
                                       recurrent_pool.index_select(0, slots))
    conv_pool.index_copy_(0, slots, conv)
    recurrent_pool.index_copy_(0, slots, recurrent)
    return out


def decode_step(layer: torch.nn.Module, x: torch.Tensor, conv: torch.Tensor, recurrent: torch.Tensor):
    """A Gated DeltaNet layer's forward for one token of each row, as transformers' own decode (its single-token
    convolution update and recurrent rule), written for Inductor: the reshapes of transformers' forward over a
    compiled step's unknown number of rows made Inductor assume it was one. Qwen3.5's b and a come from one
    projection (install_linear_attention): in float32 `a + dt_bias` on a projection's own output matched oneDNN
    fusion patterns that take only Inductor's packed weights and sizes it knows. x [rows, hidden], conv [rows, channels,
    kernel], recurrent [rows, heads, key dim, value dim] (float32): the output [rows, hidden] and the new states."""
    key_heads, value_heads = layer.num_k_heads, layer.num_v_heads
    if hasattr(layer, "in_proj_qkvz"):  # Qwen3-Next: q, k, v, z and b, a interleaved by key head
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x[:, None]), layer.in_proj_ba(x[:, None]))
        mixed = torch.cat([t.flatten(2) for t in (q, k, v)], dim=-1)[:, 0]
        z, b, a = z[:, 0].flatten(1), b[:, 0], a[:, 0]
    else:
        mixed, z = layer.in_proj_qkv(x), layer.in_proj_z(x)
        b, a = layer.rill_in_proj_ba(x).split(value_heads, dim=-1)
    weight = layer.conv1d.weight[:, 0]
    window = torch.cat([conv[..., 1:], mixed.to(conv.dtype)[..., None]], dim=-1)
    mixed = (window.to(weight.dtype) * weight).sum(-1)
    if layer.conv1d.bias is not None:
        mixed = mixed + layer.conv1d.bias
    mixed = ACT2FN[layer.activation](mixed).to(x.dtype)
    q, k, v = mixed.split([layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    q, k = (t.unflatten(-1, (key_heads, layer.head_k_dim)).float() for t in (q, k))
    v = v.unflatten(-1, (value_heads, layer.head_v_dim)).float()
    if value_heads != key_heads:
        q, k = (t.repeat_interleave(value_heads // key_heads, dim=1) for t in (q, k))
    q = _l2norm(q) / layer.head_k_dim**0.5
    k = _l2norm(k)
    beta = b.sigmoid().float()[..., None]
    decay = (-layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)).exp()
    state = recurrent * decay[..., None, None]
    delta = (v - (state * k[..., None]).sum(-2)) * beta
    state = state + k[..., None] * delta[..., None, :]
    out = (state * q[..., None]).sum(-2).to(x.dtype)
    out = layer.norm(out, z.unflatten(-1, (value_heads, layer.head_v_dim)))  # over the last dimension alone
    return layer.out_proj(out.flatten(1)), window, state


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)  # transformers' (FLA's) l2norm


def _per_sequence(forward, states: LinearStates):
    def run(self, hidden_states: torch.Tensor, cache=None, attention_mask=None, rill_graph=None,
            **kwargs) -> torch.Tensor:
        """A compiled decode step's rows together (its metadata names their slots); in an eager step a prompt
        chunk alone over its request's slot, the decodes (one token each) together."""
        if rill_graph is not None:
            pools = (rill_graph.linear_conv[self.layer_idx], rill_graph.linear_recurrent[self.layer_idx])
            return decode_rows(self, hidden_states[0], rill_graph.linear_slots, pools).unsqueeze(0)
        conv_pool, recurrent_pool = states.pools[self.layer_idx]
        step = current_step()
        out = torch.empty_like(hidden_states)
        rows, slots = [], []
        for seq, row in start_rows(step.batch, decodes_first=not step.backend.flat):
            num, slot = seq.num_new_tokens, states.slot(seq.req)
            if num == 1:
                rows.append(row)
                slots.append(slot)
            else:
                own = SlotStates(conv_pool[slot:slot + 1], recurrent_pool[slot:slot + 1])
                out[:, row:row + num] = forward(self, hidden_states[:, row:row + num], cache=own, attention_mask=None)
        if rows:
            device = hidden_states.device
            rows_at, slots_at = (torch.tensor(v, device=device) for v in (rows, slots))
            out[0, rows_at] = decode_rows(self, hidden_states[0, rows_at], slots_at, (conv_pool, recurrent_pool))
        return out

    return run
