"""GGUF files the tests write themselves (the `gguf` package's writer), as llama.cpp's converter
writes them: a transformers Llama's or Qwen3's weights (a Llama's q and k rows in llama.cpp's RoPE
order, 2-D weights in the quantization asked, norms in float32) with the bundled GGUF's tokenizer
and chat template."""
from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import torch

from rill.engine_proc.model.bundled import bundled_gguf_path
from rill.engine_proc.model.gguf_reader import read_gguf

# The bundled GGUF's tokenizer fields, copied as they are (the model needs its 49152-token vocabulary).
TOKENIZER_FIELDS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template")


@functools.cache
def bundled_tokenizer_fields() -> list[tuple]:
    """(key, value, type, element type) of each of TOKENIZER_FIELDS in the bundled GGUF (read once)."""
    reader = read_gguf(bundled_gguf_path())
    fields = [reader.fields[key] for key in TOKENIZER_FIELDS]
    return [(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None) for f in fields]


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """q or k rows from transformers' rotate-half order into llama.cpp's interleaved one."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array of a transformers LlamaForCausalLM or Qwen3ForCausalLM."""
    config, state = model.config, {k: v.float().numpy() for k, v in model.state_dict().items()}
    llama = config.model_type == "llama"  # llama.cpp permutes a Llama's q and k, not a Qwen's
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
    if not config.tie_word_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    names = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        q, k = state[prefix + "self_attn.q_proj.weight"], state[prefix + "self_attn.k_proj.weight"]
        out[f"blk.{i}.attn_q.weight"] = llama_cpp_permute(q, heads) if llama else q
        out[f"blk.{i}.attn_k.weight"] = llama_cpp_permute(k, kv_heads) if llama else k
        if config.model_type == "qwen3":
            out[f"blk.{i}.attn_q_norm.weight"] = state[prefix + "self_attn.q_norm.weight"]
            out[f"blk.{i}.attn_k_norm.weight"] = state[prefix + "self_attn.k_norm.weight"]
        for hf_name, gguf_name in names.items():
            out[f"blk.{i}.{gguf_name}.weight"] = state[prefix + hf_name + ".weight"]
    return out


def quantize_q4_k(array: np.ndarray) -> np.ndarray:
    """A float array [rows, cols] (cols a multiple of 256) as Q4_K blocks [rows, cols / 256 * 144], as llama.cpp
    lays them out (the gguf package reads them; it writes none): per super-block of 256, float16 d and dmin, 8
    blocks of 32 with 6-bit scales sc and minimums m (w = d sc q - dmin m), then the nibbles. Each block's range
    rounded plainly, not llama.cpp's search: a Q4_K file's layout, not its best weights."""
    rows = array.shape[0]
    x = array.astype(np.float32).reshape(-1, 8, 32)
    low, high = np.minimum(x.min(-1), 0), np.maximum(x.max(-1), 0)
    scale, minimum = (high - low) / 15, -low
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = (minimum.max(-1) / 63).astype(np.float16)
    sc = np.clip(np.round(scale / np.maximum(d.astype(np.float32), 1e-30)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(minimum / np.maximum(dmin.astype(np.float32), 1e-30)[:, None]), 0, 63).astype(np.uint8)
    step = (d.astype(np.float32)[:, None] * sc)[..., None]
    offset = (dmin.astype(np.float32)[:, None] * m)[..., None]
    q = np.clip(np.round((x + offset) / np.where(step == 0, 1, step)), 0, 15).astype(np.uint8)
    packed_scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6),
                                    (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=1)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # pair c: block 2c low, block 2c + 1 high
    blocks = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed_scales, qs],
                            axis=1)
    return blocks.reshape(rows, -1)


def quantize(array: np.ndarray, quantization: gguf.GGMLQuantizationType) -> np.ndarray:
    """`array`'s blocks: the gguf package's quantizer, or quantize_q4_k."""
    if quantization == gguf.GGMLQuantizationType.Q4_K:
        return quantize_q4_k(array)
    return gguf.quants.quantize(array, quantization)


def write_gguf(model, path: Path, quantization: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
               name: str = "tiny", sampling: dict[str, float | int] | None = None,
               types: dict[str, gguf.GGMLQuantizationType] | None = None, split_max_tensors: int = 0) -> Path:
    """`model` (a transformers Llama or Qwen3 with the bundled tokenizer's vocabulary) as a GGUF at `path`;
    `sampling`: general.sampling.* fields by their last part (temp, top_k, ...), as llama.cpp writes them;
    `types`: GGUF tensor name -> its type, where it is not `quantization` (a Q4_K_M file's Q6_K layers);
    `split_max_tensors`: parts of that many tensors, as llama.cpp's convert script splits (PATH-00001-of-0000N.gguf,
    the path returned the first's)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), config.model_type, split_max_tensors=split_max_tensors)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    for key, value, value_type, sub_type in bundled_tokenizer_fields():
        writer.add_key_value(key, value, value_type, sub_type=sub_type)
    for key, value in (sampling or {}).items():
        if isinstance(value, int):
            writer.add_int32(f"general.sampling.{key}", value)
        else:
            writer.add_float32(f"general.sampling.{key}", value)
    for tensor_name, array in gguf_tensors(model).items():
        qtype = (types or {}).get(tensor_name, quantization)
        if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(tensor_name, quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(tensor_name, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = writer.format_shard_names(Path(path))
    return parts[0]


def tiny_model(family: str = "llama", seed: int = 0):
    """A random-weight Llama or Qwen3 with the bundled tokenizer's vocabulary, its rows a whole
    number of quantization blocks (32) long. The Qwen3's heads are 128 wide, as every Qwen3's:
    transformers' GGUF loader leaves head_dim at Qwen3's default."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    shared = dict(vocab_size=49152, num_hidden_layers=2, max_position_embeddings=512, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2)
    config = (LlamaConfig(**shared, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
              if family == "llama" else
              Qwen3Config(**shared, hidden_size=256, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=128))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.2)
    return model
