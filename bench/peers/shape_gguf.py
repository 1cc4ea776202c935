"""A GGUF at a config's shape with random weights, for llama.cpp's side of `bench.peers --shape`.

    python -m rill.bench.peers.shape_gguf bench/models/qwen2.5-1.5b OUT.gguf

What llama.cpp's converter and `llama-quantize Q4_0` would write for a Llama or Qwen2 of that config, the
values random: every 2-D weight in Q4_0 (blocks of 32: a float16 scale and 16 bytes of 4-bit values), the
token embedding (the tied head) in Q8_0, as the bundled Q4_1 GGUF keeps it, norms at 1 and biases at 0 in
float32. The tokenizer is the bundled GGUF's, its vocabulary padded with tokens <|pad_N|> up to the config's
vocab_size, as bench/kernels/dummy_model_dir.py pads the served sides' tokenizer: a prompt encodes to the
same ids on every side. Random bytes are written straight into the blocks (no quantization pass), so a
1.5B-parameter file takes seconds; timings do not depend on the values.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np

from rill.engine_proc.model.bundled import bundled_gguf_path
from rill.engine_proc.model.gguf_reader import read_gguf

Q = gguf.GGMLQuantizationType
TOKENIZER_FIELDS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.merges",
                    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template")
SCALES = {Q.Q4_0: 0.005, Q.Q8_0: 0.0003}  # weights of std about 0.02: 4-bit values (-8..7) or int8 times these
NORMAL_TOKEN = 1  # llama.cpp's LLAMA_TOKEN_TYPE_NORMAL


def random_blocks(rng: np.random.Generator, rows: int, cols: int, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    """(rows, bytes per row) of `kind` blocks: random quants, each block's float16 scale SCALES[kind]."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    assert cols % block_size == 0, f"rows of {cols} are not whole blocks of {block_size}"
    blocks = rng.integers(0, 256, size=(rows, cols // block_size, type_size), dtype=np.uint8)
    blocks[:, :, :2] = np.array([SCALES[kind]], dtype=np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def tensors(config: dict, rng: np.random.Generator):
    """(name, array, ggml type or None for float32) of each tensor, as llama.cpp names them."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    bias = config["model_type"] == "qwen2"  # Qwen2's q, k and v have biases
    yield "token_embd.weight", random_blocks(rng, vocab, hidden, Q.Q8_0), Q.Q8_0
    if not config.get("tie_word_embeddings", False):
        yield "output.weight", random_blocks(rng, vocab, hidden, Q.Q8_0), Q.Q8_0
    yield "output_norm.weight", np.ones(hidden, np.float32), None
    for i in range(config["num_hidden_layers"]):
        for name, rows, cols in (("attn_q", heads * head_dim, hidden), ("attn_k", kv_heads * head_dim, hidden),
                                 ("attn_v", kv_heads * head_dim, hidden), ("attn_output", hidden, heads * head_dim),
                                 ("ffn_gate", inter, hidden), ("ffn_up", inter, hidden), ("ffn_down", hidden, inter)):
            yield f"blk.{i}.{name}.weight", random_blocks(rng, rows, cols, Q.Q4_0), Q.Q4_0
            if bias and name in ("attn_q", "attn_k", "attn_v"):
                yield f"blk.{i}.{name}.bias", np.zeros(rows, np.float32), None
        yield f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32), None
        yield f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32), None


def add_tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    reader = read_gguf(bundled_gguf_path())
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    pads = range(len(tokens), vocab_size)
    writer.add_token_list([*tokens, *(f"<|pad_{i}|>" for i in pads)])
    writer.add_token_types([*types, *([NORMAL_TOKEN] * len(pads))])
    for key in TOKENIZER_FIELDS:
        field = reader.fields[key]
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[-1] if len(field.types) > 1
                             else None)


def write(config_dir: Path, path: Path, seed: int = 0) -> Path:
    config = json.loads((config_dir / "config.json").read_text())
    arch = config["model_type"]
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"{config_dir}: a {arch!r} config; this writer knows llama and qwen2")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), arch)
    writer.add_name(f"{config_dir.name} (random weights)")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(head_dim)
    add_tokenizer(writer, config["vocab_size"])
    rng = np.random.default_rng(seed)
    for name, array, kind in tensors(config, rng):
        writer.add_tensor(name, array, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.peers.shape_gguf", description=__doc__.splitlines()[0])
    ap.add_argument("config_dir", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    print(write(args.config_dir, args.out))


if __name__ == "__main__":
    main()
