"""Tiny random models of other architectures, saved by transformers: the native model's families
(Llama 3 rope, Qwen2, Qwen3, Qwen3 with YaRN, Granite, SmolLM3, Phi-3) and the transformers route's zoo."""
from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    GraniteConfig,
    LlamaConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    SmolLM3Config,
)

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip



def tiny_config(kind: str):
    if kind == "llama3-rope-untied":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # fmt: skip
        return LlamaConfig(**TINY, tie_word_embeddings=False, rope_parameters=rope)
    if kind == "qwen2":
        return Qwen2Config(**TINY, tie_word_embeddings=True)
    if kind == "qwen3":
        return Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False)
    if kind == "qwen3-yarn":  # a long-context Qwen3: YaRN, 4x its original 64 positions
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
        return Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False, rope_parameters=rope)
    if kind.startswith("granite") and kind not in PAGED_ROUTE_KINDS:  # its four multipliers, each away from 1; tied
        # or not, biased or not
        tied = kind == "granite"
        return GraniteConfig(**TINY, tie_word_embeddings=tied, attention_bias=not tied, mlp_bias=not tied,
                             embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.05,
                             logits_scaling=2.5)
    if kind == "smollm3":  # its second layer a NoPE layer (no_rope_layers [1, 0])
        return SmolLM3Config(**TINY, no_rope_layer_interval=2, tie_word_embeddings=True, pad_token_id=None,
                             bos_token_id=1, eos_token_id=2)
    if kind.startswith("phi3"):  # Phi-4's shape of Phi-3 (no window); Phi-3-mini's 4k window; Phi-4-mini's 3/4 rotary
        window = 32 if kind == "phi3-window" else None
        rotary = 0.75 if kind == "phi3-partial-rotary" else 1.0
        return Phi3Config(**TINY, sliding_window=window, partial_rotary_factor=rotary, tie_word_embeddings=False,
                          pad_token_id=None, bos_token_id=1, eos_token_id=2)
    if kind in (*PAGED_ROUTE_KINDS, "gemma4"):
        return _paged_route_config(kind)
    if kind == "phi4-mini-longrope":  # Phi-4-mini's 3/4 rotary with LongRoPE, its original context 24 tokens
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": ROPE_SWITCH,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5], "long_factor": [1.5, 2.2, 3.1, 4.4, 6.0, 8.0]}
        return Phi3Config(**{**TINY, "max_position_embeddings": 8 * ROPE_SWITCH}, partial_rotary_factor=0.75,
                          original_max_position_embeddings=ROPE_SWITCH,
                          rope_parameters=rope, tie_word_embeddings=False, pad_token_id=None, bos_token_id=1,
                          eos_token_id=2)
    if kind == "llama-dynamic":  # dynamic NTK past 24 tokens
        rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
        return LlamaConfig(**{**TINY, "max_position_embeddings": ROPE_SWITCH}, rope_parameters=rope,
                           bos_token_id=1, eos_token_id=2)
    if kind == "gpt2":  # learned absolute positions: a position off by one changes every token
        from transformers import GPT2Config

        return GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=1,
                          eos_token_id=2, pad_token_id=0)
    if kind == "gpt_neox":  # rotary on part of each head, parallel attention and MLP
        from transformers import GPTNeoXConfig

        return GPTNeoXConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=96, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                             pad_token_id=0)
    raise ValueError(kind)


# Families with no native implementation: the paged transformers route's zoo (hf_paged.py). Each
# with prompts longer than its window where it has one (WINDOW tokens).
PAGED_ROUTE_KINDS = ("gemma3_text", "gemma2", "mistral-window", "qwen3_moe", "mixtral", "gpt_oss", "olmo2",
                     "gemma4_text", "gemma4-moe", "phimoe-window", "hunyuan_v1_moe", "deepseek_v3", "qwen3_5_text",
                     "qwen3_next", "granitemoehybrid", "nemotron_h", "lfm2", "lfm2_moe")
WINDOW = 16
ROPE_SWITCH = 24  # where the length-dependent RoPE scalings change: between tests/helpers/scheduled.py's prompts' lengths


def _paged_route_config(kind: str):
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        GptOssConfig,
        MistralConfig,
        MixtralConfig,
        Olmo2Config,
        Qwen3MoeConfig,
    )

    special = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2)
    alternating = ["sliding_attention", "full_attention"]
    experts = dict(num_experts_per_tok=2)
    if kind == "gemma3_text":  # a sliding and a global layer, queries scaled by query_pre_attn_scalar
        return Gemma3TextConfig(**TINY, **special, head_dim=32, sliding_window=WINDOW, layer_types=alternating,
                                query_pre_attn_scalar=48)
    if kind in ("qwen3_5_text", "qwen3_next"):  # Gated DeltaNet layers (a state per sequence) beside full attention;
        # Qwen3-Next's with experts
        from transformers import Qwen3_5TextConfig, Qwen3NextConfig

        linear = dict(layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=2,
                      linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, head_dim=16)
        if kind == "qwen3_5_text":
            return Qwen3_5TextConfig(**{**TINY, "num_hidden_layers": 4}, **special, **linear)
        return Qwen3NextConfig(**{**TINY, "num_hidden_layers": 4}, **special, **linear, **experts, num_experts=4,
                               moe_intermediate_size=48, shared_expert_intermediate_size=48)
    if kind == "granitemoehybrid":  # Granite 4's hybrid: Mamba 2 layers (8 heads of 16, states of 16, a 16-token
        # scan chunk) beside attention layers without RoPE, experts and a shared MLP, Granite's multipliers
        from transformers import GraniteMoeHybridConfig

        return GraniteMoeHybridConfig(**{**TINY, "num_hidden_layers": 4}, **special, **experts,
                                      layer_types=["linear_attention", "full_attention"] * 2, num_local_experts=4,
                                      shared_intermediate_size=48, position_embedding_type="nope", mamba_n_heads=8,
                                      mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16,
                                      embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.05,
                                      logits_scaling=2.5)
    if kind == "nemotron_h":  # Nemotron-H: a Mamba 2 layer, attention, Mamba 2 again, then a layer of experts alone
        from transformers import NemotronHConfig

        return NemotronHConfig(**{**TINY, "num_hidden_layers": 4}, **special, hybrid_override_pattern="M*ME",
                               mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, chunk_size=16, n_groups=1,
                               head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                               moe_shared_expert_intermediate_size=48)
    if kind == "lfm2":  # LFM2: gated short convolutions (a state of their last 3 inputs) beside attention
        from transformers import Lfm2Config

        return Lfm2Config(**{**TINY, "num_hidden_layers": 4}, **special, layer_types=["conv", "full_attention"] * 2)
    if kind == "lfm2_moe":  # LFM2's MoE (LFM2-8B-A1B): a dense first layer, then experts
        from transformers import Lfm2MoeConfig

        return Lfm2MoeConfig(**{**TINY, "num_hidden_layers": 4}, **special, **experts,
                             layer_types=["conv", "full_attention"] * 2, num_experts=4, moe_intermediate_size=48,
                             num_dense_layers=1)
    if kind == "deepseek_v3":  # multi-head latent attention (keys of 16 + 8 rotary, values of 16), a dense first layer
        # then routed and shared experts (DeepSeek V3, Kimi K2, GLM-4.7-Flash's shape)
        from transformers import DeepseekV3Config

        return DeepseekV3Config(**{**TINY, "num_key_value_heads": 4}, **special, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                v_head_dim=16, kv_lora_rank=32, q_lora_rank=None, n_routed_experts=4, n_shared_experts=1,
                                moe_intermediate_size=48, num_experts_per_tok=2, n_group=1, topk_group=1,
                                first_k_dense_replace=1)
    if kind == "phimoe-window":  # PhiMoE windows its layers through its mask alone (no sliding_window to attention)
        from transformers import PhimoeConfig

        return PhimoeConfig(**TINY, **special, **experts, num_local_experts=4, sliding_window=WINDOW)
    if kind == "hunyuan_v1_moe":  # a float32 router (its gate's nn.Linear) beside the experts, QK norms
        from transformers import HunYuanMoEV1Config

        return HunYuanMoEV1Config(**TINY, **special, num_experts=4, moe_topk=2, moe_intermediate_size=48,
                                  head_dim=16)
    if kind == "gemma4":  # the checkpoints' class: Gemma 4's text model beside a vision tower, served for its text
        from transformers import Gemma4Config

        vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=16)
        return Gemma4Config(text_config={**_paged_route_config("gemma4_text").to_dict(), "pad_token_id": 0},
                            vision_config=vision, audio_config=None, boi_token_id=120, eoi_token_id=121,
                            image_token_id=122, video_token_id=123, boa_token_id=124, eoa_token_index=125,
                            audio_token_id=126)
    if kind == "gemma4-moe":  # Gemma 4's 26B-A4B: a dense MLP beside experts in every layer
        from transformers import Gemma4TextConfig

        return Gemma4TextConfig(**TINY, **special, head_dim=16, global_head_dim=32, sliding_window=WINDOW,
                                layer_types=alternating, hidden_size_per_layer_input=0, enable_moe_block=True,
                                num_experts=8, top_k_experts=2, moe_intermediate_size=48)
    if kind == "gemma4_text":  # Gemma 4: wider global layers (heads of 32, one K/V head, keys as values, partial
        # RoPE), per-layer input embeddings, the last two layers reusing the K/V of the first two
        from transformers import Gemma4TextConfig

        return Gemma4TextConfig(**{**TINY, "num_hidden_layers": 4}, **special, head_dim=16, global_head_dim=32,
                                num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
                                sliding_window=WINDOW, layer_types=alternating * 2, hidden_size_per_layer_input=8,
                                vocab_size_per_layer_input=128, final_logit_softcapping=8.0)
    if kind == "gemma2":  # soft-capped attention and final logits
        return Gemma2Config(**TINY, **special, head_dim=32, sliding_window=WINDOW, layer_types=alternating,
                            attn_logit_softcapping=5.0, final_logit_softcapping=8.0, query_pre_attn_scalar=32)
    if kind == "mistral-window":
        return MistralConfig(**TINY, **special, sliding_window=WINDOW)
    if kind == "qwen3_moe":
        return Qwen3MoeConfig(**TINY, **special, **experts, head_dim=32, num_experts=8, moe_intermediate_size=48)
    if kind == "mixtral":
        return MixtralConfig(**TINY, **special, **experts, num_local_experts=8)
    if kind == "gpt_oss":  # alternating windows, attention sinks, experts, YaRN
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
                "beta_fast": 32.0, "beta_slow": 1.0}
        return GptOssConfig(**TINY, **special, **experts, head_dim=32, num_local_experts=8, sliding_window=WINDOW,
                            layer_types=alternating, rope_parameters=rope)
    return Olmo2Config(**TINY, **special)



def save_tiny_model(kind: str, path):
    """A tiny model of `kind` (tiny_config) with seeded random weights, saved at `path`; returned."""
    return save_random_model(tiny_config(kind), path)


def save_random_model(config, path, tokenizer_dir=None):
    """A model of `config` with seeded random weights, saved at `path` (with the tokenizer files of
    `tokenizer_dir`, the bundled model's, where given: a directory `rill serve` serves); returned."""
    import shutil

    from rill.bench.serving.tiny_model import TOKENIZER_FILE_NAMES

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in hf.parameters():  # biases and norms too, so that loading each is checked
            param.normal_(0.0, 0.2)
    hf.save_pretrained(path)
    for name in TOKENIZER_FILE_NAMES if tokenizer_dir is not None else ():
        if (tokenizer_dir / name).is_file() and name != "generation_config.json":
            shutil.copyfile(tokenizer_dir / name, path / name)
    return hf
