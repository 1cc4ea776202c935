"""Any transformers causal LM over Rill's paged KV cache: continuous batching, chunked prefill and
prefix caching for a family with no native implementation (engine_proc/model/hf_attention.py)."""
from __future__ import annotations

import contextlib
import logging

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

from rill.engine_proc.attention.choice import create_attention_backend, resolve_attention_backend
from rill.engine_proc.attention.kv_cache import KVCache
from rill.engine_proc.attention.kv_layout import NO_KV_LAYER_TYPES, STATE_LAYER_TYPES, layer_kv_shapes
from rill.engine_proc.kernels.invariant_linear import tile_linears
from rill.engine_proc.kernels.linear import pack_linears_for_cpu, packed_linear
from rill.engine_proc.kernels.quantization import check_quantization, linear_class, quantize_linears
from rill.engine_proc.model.decode_graphs import DecodeGraphs
from rill.engine_proc.model.hf_attention import IMPLEMENTATION, PagedStep, step_context, window_view
from rill.engine_proc.model.hf_experts import pack_experts
from rill.engine_proc.model.hf_linear_attention import has_linear_attention, install_linear_attention, state_layers
from rill.engine_proc.model.hf_logits import LogitsForward, final_soft_cap
from rill.engine_proc.model.hf_rope import LENGTH_DEPENDENT_TYPES, install_paged_rope
from rill.engine_proc.model.hf_vision import ImageEmbedder, attention_implementations, is_vision_model
from rill.engine_proc.model.loader import LOAD_FORMATS, transformers_config
from rill.engine_proc.model.runner_api import RunnerInfo
from rill.engine_proc.model.sampling_runner import SamplingRunner
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.batch import Batch
from rill.ipc.config import ModelConfig

log = logging.getLogger("rill.model")

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")


def paged_unsupported(config) -> str | None:
    """Why this model cannot run on the paged transformers route (it then runs one sequence at a
    time, engine_proc/model/hf_runner.py), or None."""
    text_config = config.get_text_config()
    model_class = (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING if is_vision_model(config)
                   else MODEL_FOR_CAUSAL_LM_MAPPING).get(type(config), None)
    if model_class is None:
        return f"model_type {config.model_type!r} has no transformers causal-LM class"
    linear = has_linear_attention(text_config)  # its full-attention layers through the interface (hf_linear_attention)
    if not linear and not getattr(model_class, "_supports_attention_backend", False):
        return f"{model_class.__name__}'s attention does not go through transformers' attention interface"
    layer_types = set(getattr(text_config, "layer_types", None) or ())
    if linear:  # its state layers (hf_linear_attention.py) and layers of an MLP alone
        layer_types -= set(NO_KV_LAYER_TYPES)
    if other := sorted(layer_types - set(ATTENTION_LAYER_TYPES)):
        return f"its {other[0]!r} layers have no paged form"
    return None


def _short_window(config, max_model_len: int) -> int | None:
    """The model's sliding window, when it has one in use and it is shorter than its context."""
    window = getattr(config, "sliding_window", None)
    if not window or window >= max_model_len or getattr(config, "use_sliding_window", True) is False:
        return None
    return window


def uniform_window(config, max_model_len: int) -> int | None:
    """The sliding window every layer of the model attends within (Mistral, Phi-3-mini, a Qwen2 with
    every layer sliding), when shorter than its context: the scheduler releases the KV blocks that
    fall out of it. None where any layer is global (Gemma 2 and 3, GPT-OSS: see interleaved_window)."""
    window = _short_window(config, max_model_len)
    layer_types = getattr(config, "layer_types", None)
    if window is None:
        return None
    return window if layer_types is None or set(layer_types) == {"sliding_attention"} else None


def interleaved_window(config, max_model_len: int) -> tuple[int, tuple[int, ...]] | None:
    """(window, the sliding layers) of a model with both sliding-window and global layers (Gemma 2
    and 3, GPT-OSS) whose window is shorter than its context: its sliding layers get block tables of
    their own that hold the window only (engine_proc/sched/window_tables.py). None for any other."""
    window = _short_window(config, max_model_len)
    layer_types = getattr(config, "layer_types", None) or ()
    if window is None or len(set(layer_kv_shapes(config))) > 1:  # a tensor shared by layers of one shape only
        return None
    sliding = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    return (window, sliding) if 0 < len(sliding) < len(layer_types) else None


def route_layer_window(config, limits) -> tuple[int, tuple[int, ...]] | None:
    """interleaved_window() of the model as the runner will serve it (its served length, as __init__
    works it out), for the engine to size the KV cache before the runner exists."""
    text_config = config.get_text_config()
    model_len = getattr(text_config, "max_position_embeddings", None)
    if model_len is None:
        return None
    return interleaved_window(text_config, min(limits.max_model_len or model_len, model_len))


def _rope_types(config) -> set[str]:
    """Every rope_type of the config: transformers 5's rope_parameters (one dict, or one per layer
    type) or the older rope_scaling."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    dicts = [p for p in params.values() if isinstance(p, dict)] or [params]
    return {p.get("rope_type", p.get("type", "default")) for p in dicts}


class PagedTransformersRunner(SamplingRunner):
    """transformers' own modules and weights; attention through Rill's backends (`--model-impl
    transformers`, or `auto` for a family without a native implementation)."""

    verifies_drafts = True  # a draft's row as a prompt chunk's (tests/model/test_transformers_route.py)

    def __init__(self, model: ModelConfig, *, dtype: torch.dtype, device: torch.device | str, num_kv_blocks: int,
                 eos_token_ids: list[int], max_model_len: int | None = None) -> None:
        """`max_model_len`: the server's --max-model-len (None: the model's context)."""
        if model.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format {model.load_format!r}: expected one of {LOAD_FORMATS}")
        check_quantization(model.quantization, torch.device(device), model.int4_group_size, model.int4_symmetric)
        int4_options = {"group_size": model.int4_group_size, "symmetric": model.int4_symmetric}
        self.config = transformers_config(model.model_dir)
        if reason := paged_unsupported(self.config):
            raise ValueError(f"the paged transformers route cannot run this model: {reason}")
        text_config = self.config.get_text_config()
        if model.batch_invariant and _num_experts(text_config):
            raise ValueError(f"--batch-invariant is not served for mixture-of-experts models (model_type "
                             f"{self.config.model_type!r}): each expert's matmul sees as many rows as the "
                             "batch routes to it")
        self.dtype, self.device, self.block_size = dtype, torch.device(device), model.block_size
        self.vocab_size: int = text_config.vocab_size
        self.max_model_len: int = getattr(text_config, "max_position_embeddings", None) or num_kv_blocks * model.block_size
        self.attention_backend = resolve_attention_backend(model.attention_backend, self.device)
        self.attention = create_attention_backend(self.attention_backend, self.device, dtype, model.block_size,
                                                  model.batch_invariant)
        self.model = load_hf_model(model.model_dir, self.config, dtype, self.device, model.load_format)
        for module in self.model.modules():
            if hasattr(module, "_maybe_slice_kv_shared_inputs"):
                # Gemma 4 cuts a prompt to its kept rows before its layers that reuse others' K/V, for an int
                # logits_to_keep: this route keeps rows by index, so never; the check's guard on the step's
                # length would stop torch.compile.
                module._maybe_slice_kv_shared_inputs = _unsliced
        # "dynamic" and "longrope" RoPE independent of the step's other sequences (hf_rope.py)
        served_len = min(max_model_len or self.max_model_len, self.max_model_len)
        if (_rope_types(text_config) & set(LENGTH_DEPENDENT_TYPES)
                and not install_paged_rope(self.model, self.device, served_len)):
            raise ValueError("the paged transformers route cannot run this model: its RoPE scaling depends on the "
                             "sequence's length and its rotary module is not one transformers' shared code builds")
        layers = sorted(m.layer_idx for m in self.model.modules() if _is_attention(m))
        # A linear-attention layer keeps a state per request instead (hf_linear_attention.py): no drafts
        self.linear_states = None
        expected = list(range(text_config.num_hidden_layers))
        if has_linear_attention(text_config):
            self.verifies_drafts = False
            expected = [i for i in expected if text_config.layer_types[i] in ATTENTION_LAYER_TYPES]
            state_modules = state_layers(self.model, text_config)
            if sorted(m.layer_idx for m in state_modules) != [i for i, kind in enumerate(text_config.layer_types)
                                                               if kind in STATE_LAYER_TYPES]:
                raise ValueError(f"the paged transformers route cannot run this model: it found "
                                 f"{len(state_modules)} layers keeping a state of a kind it runs, not one per linear "
                                 "layer")
            self.linear_states = install_linear_attention(self.model, state_modules, self.device)
        if layers != expected:
            raise ValueError(f"the paged transformers route cannot run this model: it found attention layers "
                             f"{layers[:8]}, not one per decoder layer ({text_config.num_hidden_layers})")
        # The native model's linear kernels under transformers' modules: int8, or on the CPU the
        # packed layouts (engine_proc/kernels/linear.py); on the CPU a family's experts too.
        if model.quantization != "none":
            log.info("%s weights for %d linear layers, the head included", model.quantization,
                     quantize_linears(self.model, model.quantization, **int4_options))
        elif self.device.type == "cpu":
            pack_linears_for_cpu(self.model, model.batch_invariant)
        if self.device.type == "cpu":
            self._pack_experts(model.quantization, int4_options)
        if model.batch_invariant:  # the matmuls too: fixed-size row tiles (attention is the backend's)
            tile_linears(self.model)
        if model.max_loras:  # adapters on transformers' own linears, per row (engine_proc/lora/layers.py)
            if is_vision_model(self.config):
                raise ValueError("--enable-lora is not served for vision models")
            if getattr(text_config, "is_heterogeneous", False):
                raise ValueError("--enable-lora is not served for a model whose layers differ in shape (Gemma 4): "
                                 "an adapter's matrices are sized by the model's one shape")
            from rill.engine_proc.lora.layers import wrap_transformers_linears
            from rill.engine_proc.lora.manager import LoRAManager

            self.lora = LoRAManager(self.model, text_config, model.max_loras, model.max_lora_rank, self.device,
                                    wrap=wrap_transformers_linears)
        self.forward_logits = LogitsForward(self.model, self.attention, final_soft_cap(self.model, self.device, dtype))
        self.sliding_window = uniform_window(text_config, self.max_model_len)
        self.images = None
        if is_vision_model(self.config):
            self.images = ImageEmbedder(self.model, self.device, dtype, decodes_first=not self.attention.flat)
        # (window, sliding layers): those layers' blocks in window tables of their own (window_tables.py)
        self.layer_window = interleaved_window(text_config, served_len)
        self.kv_cache = KVCache(text_config, num_blocks=num_kv_blocks, block_size=model.block_size, dtype=dtype,
                                device=self.device, window_layers=self.layer_window[1] if self.layer_window else ())
        for module in self.model.modules():
            if _is_attention(module):  # 0: the global layers' table; 1..: a sliding group's window table
                module.rill_table_group = self.kv_cache.layer_places[module.layer_idx][0]
                # A family that windows every layer through its mask alone (PhiMoE passes no sliding_window to the
                # attention function) still attends within the window whose blocks the scheduler releases
                module.rill_window = self.sliding_window
        self.sampler = Sampler(eos_token_ids, model.seed, device=self.device,
                               use_triton=self.attention_backend == "triton")
        self.decode_graphs = None
        if self.linear_states is not None and not self.linear_states.compiled:
            log.info("decode steps run eagerly: its state layers (%s) have no decode step written for Inductor",
                     type(state_modules[0]).__name__)
        elif not model.enforce_eager and not model.batch_invariant:
            self.decode_graphs = self._compiled_decode(model.max_num_seqs)
        if self.decode_graphs is not None and self.images is not None and self.images.mrope:
            self.decode_graphs.rope_offset = self.images.rope_offset
        self.info = RunnerInfo("transformers", self.attention_backend, self.decode_graphs is not None)

    def _compiled_decode(self, max_num_seqs: int) -> DecodeGraphs | None:
        """Decode-only steps through torch.compile, as the native model's (decode_graphs.py): on the
        CPU with the C++ decode kernel, which takes every layer's window, soft-cap and sinks."""
        if not (self.attention.name == "cpu" and getattr(self.attention, "decode_kernel", False)):
            return None
        try:
            graphs = DecodeGraphs(self.forward_logits, self.kv_cache, self.block_size, self.device, max_num_seqs)
            graphs.linear_states = self.linear_states
            graphs.warm_up()
        except Exception as exc:  # a family whose forward does not compile: serve, slower
            log.warning("decode steps run eagerly: torch.compile failed (%s: %s)", type(exc).__name__, exc)
            return None
        return graphs

    def _pack_experts(self, quantization: str, int4_options: dict) -> None:
        """A mixture of experts: each expert's projections in the native linear kernels (hf_experts.py)."""
        if quantization != "none":
            quantized = linear_class(quantization, **int4_options)
            make = lambda weight, bias, name: quantized(weight, bias)  # noqa: E731
        else:
            make = lambda weight, bias, name: packed_linear(weight, bias, name, False)  # noqa: E731
        try:
            num_packed = pack_experts(self.model, make)
        except (RuntimeError, AttributeError) as exc:  # a dtype oneDNN cannot pack here: transformers' own
            log.info("experts keep transformers' grouped GEMM: %s", exc)
            return
        if num_packed:
            log.info("experts of %d layers packed for the CPU, one GEMM per expert a step", num_packed)

    @torch.inference_mode()
    def compute_logits(self, batch: Batch, eager: bool = False, hidden_only: bool = False) -> torch.Tensor:
        """Logits of the sampled rows, then the prompt-scoring rows (step_inputs.logits_rows): the
        step's sequences as one row of tokens, the LM head (and the family's logit scaling or
        soft-capping, in its own forward) on the rows asked for only."""
        assert not hidden_only, "the transformers route does not embed (refused at start)"
        # A step with an adapter runs eagerly: the compiled graph holds the base linears alone.
        uses_lora = self.lora is not None and any(s.req.lora for s in batch.seqs)
        if self.linear_states is not None:  # each sequence's slot of states, at its position
            self.linear_states.begin_step(batch)
        if self.decode_graphs is not None and not eager and not uses_lora and self.decode_graphs.can_run(batch):
            return self.decode_graphs.run(batch)
        with self.lora.step_rows(batch, self.attention.flat) if uses_lora else contextlib.nullcontext():
            return self._eager_logits(batch)

    def _eager_logits(self, batch: Batch) -> torch.Tensor:
        input_ids, positions, meta, logits_indices = self.attention.prepare(batch)
        # A window at least as long as the step's longest sequence masks nothing: its layers take the kernels
        longest = max(s.start_pos + s.num_new_tokens for s in batch.seqs)
        step = PagedStep(self.attention, self.kv_cache, meta, batch, positions, longest)
        if self.layer_window is not None:  # the same rows over each sliding group's window tables
            step.window_batches = [window_view(batch, j) for j in range(self.kv_cache.num_window_groups)]
            step.window_metas = [self.attention.prepare(b)[2] for b in step.window_batches]
        with step_context(step):
            if self.images is not None:  # a vision model (hf_vision.py): images' features, 3-D rotary positions
                step.images = self.images.whole_images(batch)
                inputs = self.images(batch, input_ids) if self.images.needed(batch) else None
                return self.forward_logits(input_ids, positions, None, self.kv_cache, logits_indices, inputs,
                                           self.images.positions(batch, positions))
            return self.forward_logits(input_ids, positions, None, self.kv_cache, logits_indices)


def _num_experts(config) -> int:
    return next((getattr(config, name) for name in ("num_experts", "num_local_experts", "n_routed_experts")
                 if getattr(config, name, None)), 0)


def _unsliced(hidden_states, per_layer_inputs, position_embeddings, causal_mask_mapping, *args, **kwargs):
    return hidden_states, per_layer_inputs, position_embeddings, causal_mask_mapping


def _is_attention(module: torch.nn.Module) -> bool:
    """A decoder layer's self-attention: what transformers names *Attention and gives a layer index, over the paged
    cache (not a vision tower's, as Gemma 4's, which indexes its layers too)."""
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", IMPLEMENTATION)
    return (type(module).__name__.endswith("Attention") and isinstance(getattr(module, "layer_idx", None), int)
            and implementation == IMPLEMENTATION)


def load_hf_model(model_dir, config, dtype: torch.dtype, device: torch.device, load_format: str,
                  attn_implementation: str = IMPLEMENTATION):
    """transformers' model of the directory (or of its config, with `dummy` weights), eval, on `device`."""
    auto_class = AutoModelForCausalLM
    if is_vision_model(config):  # its vision tower's attention is not over the paged cache
        auto_class = AutoModelForImageTextToText
    if "text_config" in (getattr(config, "sub_configs", None) or {}):  # nor a tower of a model served for its
        attn_implementation = attention_implementations(config, attn_implementation or "sdpa")  # text (Gemma 4)
    if load_format == "dummy":
        # Seeded, as the native model's dummy weights are: every data-parallel engine (and every
        # start) gets the same weights, so they answer alike.
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = auto_class.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    else:
        model = auto_class.from_pretrained(
            str(model_dir), config=config, dtype=dtype, local_files_only=True, attn_implementation=attn_implementation,
            use_safetensors=True if load_format == "safetensors" else None,
        )
    return model.to(device).eval().requires_grad_(False)
