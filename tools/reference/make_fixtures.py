#!/usr/bin/env python3
"""Builds Longhaul's reference fixtures from Hugging Face transformers.

Each fixture is a tiny random-weight checkpoint in Hugging Face format plus
`expected.json`: transformers' teacher-forced logits for a token sequence and
the tokens its greedy `generate` produces for a prompt. The Rust tests load
each checkpoint with Longhaul and demand the same numbers.

The weights are drawn at a scale where activations stay O(1) (std 1/sqrt(fan-in)),
norm weights are not all ones and router biases are not zero, so that a wrong
norm, a swapped projection or a mis-ordered rope shows up as a large error
rather than hiding under tiny activations.

Run by hand (not in CI; torch from PyPI is large):

    python3 -m venv ~/.cache/longhaul/refvenv
    ~/.cache/longhaul/refvenv/bin/pip install torch transformers safetensors numpy
    ~/.cache/longhaul/refvenv/bin/python tools/reference/make_fixtures.py engine/tests/fixtures

It rewrites every fixture folder under the output folder, or only those named
after it (`... make_fixtures.py engine/tests/fixtures deepseek_v3_fp8`).
"""

import contextlib
import copy
import json
import os
import math
import re
import shutil
import tempfile
import sys
from pathlib import Path

import numpy as np
import torch

import harmony
import kimi_vocab
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 512
HIDDEN = 64
GREEDY_TOKENS = 32
# Embeddings double as the LM head when tied; this keeps logits O(1) either way.
EMBED_STD = 0.3
# How far transformers' own logits may move when it reloads the written checkpoint.
RELOAD_TOLERANCE = 1e-5
# model_type values transformers knows under another name (Kimi K2 ships as
# remote code around DeepSeek-V3's modeling).
REFERENCE_TYPE = {"kimi_k2": "deepseek_v3"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEACHER_TEXT = "The quick brown fox jumps over the lazy dog while Longhaul streams experts from four drives."
PROMPT_TEXT = "Audit the storage engine and"

CORPUS = """
Longhaul runs large mixture of experts language models on one computer by streaming expert weights
from several drives. The quick brown fox jumps over the lazy dog. A router picks a few experts for
every token, and only those experts are read. The cache keeps the hot experts in memory, and the
pilot predicts which experts the next layer will need. Audit the storage engine and report what you
find. Draft an architecture for a job queue that survives a power cut. The answer is waiting in the
morning. Every drive reads in parallel, and the throughput of each drive is shown on the dashboard.
""" * 4


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer)
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def rope_old_style(params: dict) -> dict:
    """Released-config spelling: rope_theta at the top, rope_scaling beside it."""
    params = dict(params)
    out = {"rope_theta": params.pop("rope_theta")}
    kind = params.pop("rope_type")
    if kind != "default":
        out["rope_scaling"] = {"type": kind, **params}
    else:
        out["rope_scaling"] = None
    return out


DEEPSEEK_V3_SPEC = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "intermediate_size": 96,
    "moe_intermediate_size": 24,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "rope_interleave": True,
    "rope": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "mscale": 0.9,
        "mscale_all_dim": 0.7,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "original_max_position_embeddings": 16,
    },
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}

# name, model_type, config, options
GPT_OSS_SPEC = {
    "model_type": "gpt_oss",
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "attention_bias": True,
    # Small enough that the teacher text crosses the window and the clamp bites.
    "sliding_window": 6,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 1.5,
    "rope": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}

FIXTURE_KIMI_K25_TEXT = {
    "model_type": "kimi_k2",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "n_group": 8,
    "topk_group": 4,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "first_k_dense_replace": 1,
    "rope_interleave": True,
    "rope": {
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 32.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 4096,
    },
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}

KIMI_LINEAR_SPEC = {
    "model_type": "kimi_linear",
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": None,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "intermediate_size": 96,
    "moe_intermediate_size": 24,
    "num_experts": 16,
    "num_experts_per_token": 4,
    "num_shared_experts": 1,
    "num_expert_group": 4,
    "topk_group": 2,
    "moe_renormalize": True,
    "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1,
    # As the release spells it: 1-based layer lists.
    "linear_attn_config": {
        "head_dim": 16,
        "num_heads": 4,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3, 5],
        "full_attn_layers": [4],
    },
    "rope": None,
    # Its default (163839) lies outside a small vocabulary.
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}

QWEN3_NEXT_SPEC = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 12,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "partial_rotary_factor": 0.5,
    "rope": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
}

QWEN3_5_MOE_TEXT = {
    "model_type": "qwen3_5_moe_text",
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
    "num_experts": 12,
    "num_experts_per_tok": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "rope": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
    "tie_word_embeddings": False,
}

FIXTURES = [
    (
        "qwen3_moe_released",
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": False,
            "mlp_only_layers": [1],
            "decoder_sparse_step": 1,
            "rope": {"rope_type": "default", "rope_theta": 10000.0},
            "tie_word_embeddings": False,
        },
        {"style": "old", "layout": "per_expert", "dtype": "float32", "shards": 1},
    ),
    (
        "qwen3_moe_recent",
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "attention_bias": True,
            "intermediate_size": 80,
            "moe_intermediate_size": 24,
            "num_experts": 12,
            "num_experts_per_tok": 3,
            "norm_topk_prob": True,
            "decoder_sparse_step": 2,
            "use_sliding_window": True,
            "sliding_window": 5,
            "rope": {"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0},
            "tie_word_embeddings": True,
        },
        {"style": "new", "layout": "fused", "dtype": "bfloat16", "shards": 2},
    ),
    (
        "mixtral_released",
        {
            "model_type": "mixtral",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "intermediate_size": 48,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "rope": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": False,
        },
        {"style": "old", "layout": "per_expert", "dtype": "float16", "shards": 1},
    ),
    (
        "mixtral_recent",
        {
            "model_type": "mixtral",
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 24,
            "intermediate_size": 40,
            "num_local_experts": 6,
            "num_experts_per_tok": 3,
            "sliding_window": 6,
            "rope": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 8.0,
                "beta_slow": 2.0,
            },
            "max_position_embeddings": 64,
            "tie_word_embeddings": False,
        },
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1},
    ),
    (
        "deepseek_v3_released",
        DEEPSEEK_V3_SPEC,
        {"style": "old", "layout": "per_expert", "dtype": "float32", "shards": 1},
    ),
    (
        "kimi_k2_recent",
        {
            "model_type": "kimi_k2",
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "q_lora_rank": None,
            "kv_lora_rank": 24,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 16,
            "v_head_dim": 16,
            "intermediate_size": 64,
            "moe_intermediate_size": 16,
            "n_routed_experts": 8,
            "n_shared_experts": 2,
            "num_experts_per_tok": 3,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.7,
            "first_k_dense_replace": 0,
            "rope_interleave": False,
            "rope": {"rope_type": "default", "rope_theta": 20000.0},
            "tie_word_embeddings": False,
        },
        {"style": "new", "layout": "fused", "dtype": "bfloat16", "shards": 1},
    ),
    (
        "kimi_k25_text",
        FIXTURE_KIMI_K25_TEXT,
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1, "wrap": "kimi_k25"},
    ),
    # DeepSeek-V3 as published in FP8; an intermediate size of 200 makes
    # 1.5-block edges.
    (
        "deepseek_v3_fp8",
        dict(DEEPSEEK_V3_SPEC, intermediate_size=200),
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1, "fp8": True},
    ),
    # Kimi K2-Thinking's layout: the DeepSeek-V3 architecture with INT4
    # routed experts through compressed-tensors, everything else BF16.
    (
        "kimi_k2_int4",
        dict(DEEPSEEK_V3_SPEC, model_type="kimi_k2", moe_intermediate_size=64),
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "int4": True},
    ),
    # gpt-oss as save_pretrained writes it (BF16, experts transposed and
    # interleaved) and as released (MXFP4 experts, old-style rope fields).
    ("gpt_oss_bf16", GPT_OSS_SPEC, {"style": "new", "layout": "fused", "dtype": "bfloat16", "shards": 1}),
    (
        "gpt_oss_mxfp4",
        GPT_OSS_SPEC,
        {"style": "old", "layout": "fused", "dtype": "bfloat16", "shards": 1, "mxfp4": True},
    ),
    # gpt-oss as OpenAI publishes it: harmony's special tokens, the release's
    # chat template and generation config, MXFP4 experts; scripted weights
    # answer in harmony's analysis and final channels.
    (
        "gpt_oss_harmony",
        dict(GPT_OSS_SPEC, num_hidden_layers=2),
        {"style": "old", "layout": "fused", "dtype": "bfloat16", "shards": 1, "mxfp4": True,
         "tokenizer": "harmony", "script": "harmony"},
    ),
    # Kimi-K2.5 as transformers 5.24 saves it: its wrapper ties the head to
    # the embedding and writes no `lm_head`, while the text config says untied.
    (
        "kimi_k25_saved",
        dict(FIXTURE_KIMI_K25_TEXT, tie_word_embeddings=True),
        {"style": "new", "layout": "per_expert", "dtype": "bfloat16", "shards": 1, "wrap": "kimi_k25", "saved": True},
    ),
    # Kimi-Linear as released (KDA + MLA without rotary, per-expert `w1/w2/w3`
    # under `block_sparse_moe`, q/k/v convolutions apart) and as transformers
    # 5.24 holds it (fused experts, `layer_types`, a low-rank query, a
    # kernel of 3, dense and sparse layers named one by one).
    (
        "kimi_linear_released",
        KIMI_LINEAR_SPEC,
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1},
    ),
    (
        "kimi_linear_recent",
        dict(
            KIMI_LINEAR_SPEC,
            num_hidden_layers=4,
            q_lora_rank=24,
            linear_attn_config=None,
            linear_num_heads=2,
            linear_head_dim=24,
            linear_conv_kernel_dim=3,
            layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
            mlp_layer_types=["sparse", "dense", "sparse", "sparse"],
            num_shared_experts=2,
            num_expert_group=1,
            topk_group=1,
            moe_renormalize=False,
        ),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1},
    ),
    # Qwen3-Next as released (per-expert, BF16, top-level partial rotary,
    # GDN projections interleaved per key head) and with fused experts, a
    # full-attention layer every second layer and experts not renormalised.
    (
        "qwen3_next_released",
        QWEN3_NEXT_SPEC,
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1},
    ),
    (
        "qwen3_next_recent",
        dict(QWEN3_NEXT_SPEC, full_attention_interval=2, norm_topk_prob=False, mlp_only_layers=[], linear_conv_kernel_dim=2),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1},
    ),
    # Qwen3.5-MoE's multimodal release: the text model under
    # `model.language_model.`, interleaved MRoPE, projections apart.
    (
        "qwen3_5_moe_wrapped",
        QWEN3_5_MOE_TEXT,
        {"style": "new", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "wrap": "qwen3_5_moe"},
    ),
]

MINIMAX_M2_RELEASED_FIELDS = {
    # Fields the release's config carries that transformers does not read.
    "use_qk_norm": True,
    "qk_norm_type": "per_layer",
    "scoring_func": "sigmoid",
    "use_routing_bias": True,
    "shared_intermediate_size": 0,
}
FIXTURES += [
    (
        "minimax_m2_released",
        {
            "model_type": "minimax_m2",
            "num_hidden_layers": 2,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            # Queries 96 wide over a hidden size of 64: a per-head norm would show.
            "head_dim": 16,
            "rotary_dim": 8,
            "intermediate_size": 32,
            "num_local_experts": 8,
            "num_experts_per_tok": 3,
            "rope": {"rope_type": "default", "rope_theta": 5000000.0},
            "attn_type_list": [1, 1],
            "tie_word_embeddings": False,
            **MINIMAX_M2_RELEASED_FIELDS,
        },
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1},
    ),
    (
        "minimax_m2_recent",
        {
            "model_type": "minimax_m2",
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "intermediate_size": 24,
            "num_local_experts": 6,
            "num_experts_per_tok": 2,
            "rope": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
            "tie_word_embeddings": True,
        },
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1},
    ),
]

# GLM-5 (DeepSeek sparse attention). index_topk 6 of the teacher text's 26
# positions makes the indexer's choice decide most rows.
GLM_MOE_DSA_SPEC = {
    "model_type": "glm_moe_dsa",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "intermediate_size": 96,
    "moe_intermediate_size": 24,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 3,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "index_topk": 6,
    "index_head_dim": 16,
    "index_n_heads": 8,
    "tie_word_embeddings": False,
}
FIXTURES += [
    (
        "glm_moe_dsa_released",
        dict(
            GLM_MOE_DSA_SPEC,
            first_k_dense_replace=1,
            # Layers 0, 1 and 3 run their indexer; layer 2 reuses layer 1's choice.
            index_topk_freq=2,
            index_skip_topk_offset=2,
            rope={"rope_type": "default", "rope_theta": 1000000.0},
        ),
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1},
    ),
    (
        "glm_moe_dsa_recent",
        dict(
            GLM_MOE_DSA_SPEC,
            mlp_layer_types=["dense", "sparse", "dense", "sparse"],
            indexer_types=["full", "shared", "shared", "full"],
            n_group=2,
            topk_group=1,
            num_experts_per_tok=2,
            rope={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 16,
            },
        ),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1},
    ),
]

# DeepSeek-V4 at fixture scale: every attention kind, hash and scored
# routing, two residual streams. The 26-token teacher text closes 6 sparse
# entries (rate 4, 3 kept by the indexer) and 3 heavy ones (rate 8), and
# outgrows the 6-token window.
DEEPSEEK_V4_SPEC = {
    "model_type": "deepseek_v4",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 32,
    "partial_rotary_factor": 0.25,
    "q_lora_rank": 48,
    "o_groups": 2,
    "o_lora_rank": 16,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 1.5,
    "hc_mult": 2,
    "index_n_heads": 4,
    "index_head_dim": 16,
    "index_topk": 3,
    "sliding_window": 6,
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
    "rope_theta": 10000.0,
    "compress_rope_theta": 40000.0,
    "rope": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
             "beta_fast": 32.0, "beta_slow": 1.0},
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
# As DeepSeek releases V4: the original config fields (`compress_ratios`,
# `num_hash_layers`, `qk_rope_head_dim`, a flat YaRN `rope_scaling`) and
# tensor names (`embed.weight`, `layers.N.attn.wq_a.weight`, experts one by
# one as `ffn.experts.E.w1`), which transformers converts on loading.
DEEPSEEK_V4_RELEASED = {
    k: v for k, v in DEEPSEEK_V4_SPEC.items()
    if k not in ("layer_types", "mlp_layer_types", "partial_rotary_factor", "compress_rates", "rope")
}
DEEPSEEK_V4_RELEASED.update(
    compress_ratios=[0, 4, 128, 4],
    compress_rate_hca=8,
    num_hash_layers=2,
    qk_rope_head_dim=8,
    rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
          "beta_fast": 32.0, "beta_slow": 1.0},
)
# DeepSeek-V4's published formats: FP8 projections with E8M0 (power-of-two)
# 128x128 block scales, FP4 routed experts with an E8M0 scale per 32.
V4_FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "scale_fmt": "ue8m0",
                 "weight_block_size": [128, 128]}
V4_FP8_LAYERS = ("wq_a", "wq_b", "wkv", "wo_a", "wo_b", "w1", "w2", "w3")

FIXTURES += [
    ("deepseek_v4_recent", DEEPSEEK_V4_SPEC, {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1}),
    # A hidden size of 64 makes every FP8 block partial; FP4 rows are 2 blocks.
    # Seeded apart, as the released-names fixture is (other seeds tie at the cut).
    ("deepseek_v4_fp8_fp4", DEEPSEEK_V4_RELEASED,
     {"style": "old", "layout": "deepseek_v4_released", "dtype": "bfloat16", "shards": 1, "seed": 202,
      "v4_quant": True}),
    ("deepseek_v4_released", DEEPSEEK_V4_RELEASED,
     # Seeded apart: the list position's seed ties two scores at the indexer's cut.
     {"style": "old", "layout": "deepseek_v4_released", "dtype": "bfloat16", "shards": 1, "seed": 102}),
]

# Appended last, so that every earlier fixture keeps its seed.
FIXTURES += [
    # DeepSeek-V4 as transformers' `save_pretrained` writes it back: released
    # names under `model.`, the attention's `kv_norm` as `attn.norm`.
    ("deepseek_v4_saved", DEEPSEEK_V4_SPEC,
     {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "save_pretrained": True, "seed": 202}),
    # GLM-5-FP8's layout: DeepSeek-V3's FP8 with 128x128 block scales; an
    # intermediate size of 200 makes 1.5-block edges.
    (
        "glm_moe_dsa_fp8",
        dict(GLM_MOE_DSA_SPEC, first_k_dense_replace=1, intermediate_size=200),
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1, "fp8": True},
    ),
]

# GLM-4.5 (glm4_moe) as released (per-expert, old-style rope with the rotary
# factor at the top, q/k norms, q/k/v biases, queries wider than the
# hidden size, the MTP layer after the decoder) and as transformers 5.24
# writes it (fused experts, rope_parameters, the rotary factor left to its
# default of a half, no q/k norms, two expert groups).
GLM4_MOE_SPEC = {
    "model_type": "glm4_moe",
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 3,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "attention_bias": True,
    "use_qk_norm": True,
    "partial_rotary_factor": 0.5,
    "num_nextn_predict_layers": 1,
    "rope": {"rope_type": "default", "rope_theta": 1000000.0},
    "tie_word_embeddings": False,
}
# DeepSeek-V3.2 as released (FP8 with power-of-two 128x128 block scales, the
# indexer's projections in FP8 too, the release's routing fields, the MTP
# layer) and as transformers 5.24 holds it (fused experts, dense and sparse
# layers listed).
DEEPSEEK_V32_SPEC = {
    **{k: v for k, v in DEEPSEEK_V3_SPEC.items() if k != "rope_interleave"},
    "model_type": "deepseek_v32",
    "num_hidden_layers": 4,
    "index_topk": 6,
    "index_head_dim": 16,
    "index_n_heads": 8,
}
DEEPSEEK_V32_RELEASED_FIELDS = {
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "ep_size": 1,
    "moe_layer_freq": 1,
    "num_nextn_predict_layers": 1,
}
FIXTURES += [
    ("glm4_moe_released", GLM4_MOE_SPEC,
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "mtp": True, "seed": 301}),
    # GLM-4.5-FP8's kind: compressed-tensors FP8 per channel and per tensor.
    ("glm4_moe_fp8", GLM4_MOE_SPEC,
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "mtp": True, "ct_fp8": True,
      "seed": 303}),
    (
        "glm4_moe_recent",
        {
            **{k: v for k, v in GLM4_MOE_SPEC.items() if k not in ("partial_rotary_factor", "num_nextn_predict_layers")},
            "use_qk_norm": False,
            "n_group": 2,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 2,
            "rope": {"rope_type": "default", "rope_theta": 10000.0},
        },
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 302},
    ),
    (
        "deepseek_v32_released",
        dict(DEEPSEEK_V32_SPEC, intermediate_size=200, **DEEPSEEK_V32_RELEASED_FIELDS),
        {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1, "fp8": True,
         "fp8_extra": ("wq_b", "wk"), "ue8m0": True, "mtp": True, "seed": 303},
    ),
    (
        "deepseek_v32_recent",
        dict(DEEPSEEK_V32_SPEC, mlp_layer_types=["dense", "sparse", "dense", "sparse"]),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 304},
    ),
    # Kimi K2 as Moonshot publishes it: tiktoken.model with its special ids
    # named by added_tokens_decoder, a chat_template.jinja, no tokenizer.json.
    ("kimi_k2_published", dict(DEEPSEEK_V3_SPEC, model_type="kimi_k2"),
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 1, "tokenizer": "kimi", "seed": 306}),
    # Kimi-Linear as transformers 5.24's save_pretrained writes it back: every
    # MLP, the dense first layer's too, under `block_sparse_moe`.
    ("kimi_linear_saved", KIMI_LINEAR_SPEC,
     {"style": "old", "layout": "fused", "dtype": "float32", "shards": 1, "save_pretrained": True, "seed": 305}),
]

# transformers' tensor names → DeepSeek's released ones (the inverse of
# transformers' `deepseek_v4` conversion mapping), within a layer.
V4_TOP_NAMES = {
    "model.embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}
V4_LAYER_NAMES = [
    ("input_layernorm.", "attn_norm."),
    ("post_attention_layernorm.", "ffn_norm."),
    ("attn_hc.", "hc_attn_"),
    ("ffn_hc.", "hc_ffn_"),
    ("self_attn.compressor.indexer.q_b_proj.", "attn.indexer.wq_b."),
    ("self_attn.compressor.indexer.scorer.weights_proj.", "attn.indexer.weights_proj."),
    ("self_attn.compressor.indexer.kv_proj.", "attn.indexer.compressor.wkv."),
    ("self_attn.compressor.indexer.gate_proj.", "attn.indexer.compressor.wgate."),
    ("self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"),
    ("self_attn.compressor.indexer.kv_norm.", "attn.indexer.compressor.norm."),
    ("self_attn.compressor.kv_proj.", "attn.compressor.wkv."),
    ("self_attn.compressor.gate_proj.", "attn.compressor.wgate."),
    ("self_attn.compressor.position_bias", "attn.compressor.ape"),
    ("self_attn.compressor.kv_norm.", "attn.compressor.norm."),
    ("self_attn.sinks", "attn.attn_sink"),
    ("self_attn.q_a_proj.", "attn.wq_a."),
    ("self_attn.q_a_norm.", "attn.q_norm."),
    ("self_attn.q_b_proj.", "attn.wq_b."),
    ("self_attn.kv_proj.", "attn.wkv."),
    ("self_attn.kv_norm.", "attn.kv_norm."),
    ("self_attn.o_a_proj.", "attn.wo_a."),
    ("self_attn.o_b_proj.", "attn.wo_b."),
    ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    ("mlp.gate.", "ffn.gate."),
    ("mlp.shared_experts.gate_proj.", "ffn.shared_experts.w1."),
    ("mlp.shared_experts.up_proj.", "ffn.shared_experts.w3."),
    ("mlp.shared_experts.down_proj.", "ffn.shared_experts.w2."),
]



# dots.llm1 (dots1) as released (per-expert, rope_theta at the top, two
# shared experts, `n_group`/`topk_group` null, which transformers cannot
# load and which mean one group, `max_window_layers` covering every layer)
# and as transformers 5.24 writes it (fused experts, rope_parameters, the
# last layers sliding through a window the teacher text crosses, biases on
# q/k/v and the output, two expert groups).
DOTS1_SPEC = {
    "model_type": "dots1",
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 2,
    "num_experts_per_tok": 3,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "sliding_window": None,
    "max_window_layers": 3,
    "rope": {"rope_type": "default", "rope_theta": 10000000.0},
    "tie_word_embeddings": False,
}
FIXTURES += [
    ("dots1_released", DOTS1_SPEC,
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "seed": 401,
      "published": {"n_group": None, "topk_group": None, "scoring_func": "sigmoid"}}),
    (
        "dots1_recent",
        dict(DOTS1_SPEC, num_hidden_layers=4, attention_bias=True, n_group=2, topk_group=1, num_experts_per_tok=2,
             norm_topk_prob=False, routed_scaling_factor=1.0, sliding_window=5, max_window_layers=2,
             rope={"rope_type": "default", "rope_theta": 10000.0}),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 402},
    ),
]



# Hunyuan-A13B (hunyuan_v1_moe) as released (per-expert, `attention_head_dim`
# for the head size, per-layer lists for top-k, expert width and shared
# experts, the fixed NTK stretch labelled "dynamic", tied embeddings) and as
# transformers 5.24 writes it (fused experts, rope_parameters, one top-k,
# biases, an untied head).
HUNYUAN_SPEC = {
    "model_type": "hunyuan_v1_moe",
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 24,
    "moe_intermediate_size": [24, 24, 24],
    "num_experts": 8,
    "moe_topk": [2, 3, 2],
    "num_shared_expert": [1, 1, 1],
    "use_mixed_mlp_moe": True,
    "use_qk_norm": True,
    "use_cla": False,
    "rope": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0},
    "tie_word_embeddings": True,
}
FIXTURES += [
    ("hunyuan_v1_moe_released", HUNYUAN_SPEC,
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "seed": 411,
      "published": {"attention_head_dim": 16}, "unpublished": ("head_dim",)}),
    (
        "hunyuan_v1_moe_recent",
        {**{k: v for k, v in HUNYUAN_SPEC.items() if k not in ("moe_intermediate_size", "num_shared_expert")},
         "num_hidden_layers": 4, "moe_topk": 2, "attention_bias": True, "tie_word_embeddings": False,
         "rope": {"rope_type": "default", "rope_theta": 50000.0}},
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 412},
    ),
]



# ERNIE 4.5 MoE (ernie4_5_moe) as the PT releases are laid out (per-expert,
# the router's bias under `mlp.moe_statics`, rope_theta at the top, tied
# embeddings, `head_dim` and `moe_layer_end_index` null, an MTP block
# after the decoder) and as transformers 5.24 writes it (fused experts, the
# bias under the gate, rope_parameters, sparse layers every second one up to
# an end index, an untied head).
ERNIE_SPEC = {
    "model_type": "ernie4_5_moe",
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "moe_num_experts": 8,
    "moe_k": 3,
    "moe_num_shared_experts": 2,
    "moe_layer_start_index": 1,
    "moe_layer_interval": 1,
    "use_bias": False,
    "rope": {"rope_type": "default", "rope_theta": 500000.0},
    "tie_word_embeddings": True,
}
FIXTURES += [
    ("ernie4_5_moe_released", ERNIE_SPEC,
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "seed": 421, "mtp": "ernie",
      "published": {"head_dim": None, "moe_layer_end_index": None, "num_nextn_predict_layers": 1}}),
    (
        "ernie4_5_moe_recent",
        dict(ERNIE_SPEC, num_hidden_layers=5, moe_layer_start_index=0, moe_layer_end_index=3, moe_layer_interval=2,
             moe_k=2, moe_num_shared_experts=1, head_dim=24, tie_word_embeddings=False,
             rope={"rope_type": "default", "rope_theta": 10000.0}),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 422},
    ),
]



# Llama 4 as Scout is released (the text model under `language_model.`
# beside a vision tower, `text_config` nested, every layer sparse and top-1,
# one layer in four without rope, llama3 rope with equal band edges, L2 q/k
# norms) and Maverick's kind as a flat text config (dense and sparse layers
# alternating, top-2, no q/k norms, biases, the llama3 band in use). Chunks
# of 8 positions and a temperature floor of 4 make both bite within the
# teacher text.
LLAMA4_SPEC = {
    "model_type": "llama4_text",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 24,
    "intermediate_size_mlp": 96,
    "num_local_experts": 8,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "no_rope_layers": [1, 1, 1, 0],
    "attention_chunk_size": 8,
    "attn_temperature_tuning": True,
    "floor_scale": 4,
    "attn_scale": 0.5,
    "rope": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
             "high_freq_factor": 1.0, "original_max_position_embeddings": 16},
    "tie_word_embeddings": False,
}
FIXTURES += [
    ("llama4_released", LLAMA4_SPEC,
     {"style": "old", "layout": "fused", "dtype": "bfloat16", "shards": 2, "seed": 431, "wrap": "llama4"}),
    (
        "llama4_recent",
        dict(LLAMA4_SPEC, num_hidden_layers=5, interleave_moe_layer_step=2, num_experts_per_tok=2, use_qk_norm=False,
             attention_bias=True, no_rope_layers=None,
             rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 432},
    ),
]



# Ling 3.0 (bailing_hybrid) as released (Ling's names: `word_embeddings`,
# `attention` with its output `dense`, the forget gate's tensors in the
# attention, q/k/v convolved by three kernels, `gate.expert_bias`;
# per-expert experts; the safe gate, its bound raised from the release's -5
# to -2 (at -5 the reference's chunked prompt form and its own recurrent
# form already differ by 9e-5 over the teacher text); an `rms_norm_eps` other than the MLA
# latent norms' own 1e-6; the MTP layer after the decoder) and as
# transformers 5.24 writes it (fused experts, one convolution, the
# softplus decay, a low-rank query, layer kinds listed).
BAILING_SPEC = {
    "model_type": "bailing_hybrid",
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "layer_group_size": 3,
    "short_conv_kernel_size": 4,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "num_experts": 16,
    "num_experts_per_token": 4,
    "num_shared_experts": 1,
    "num_expert_group": 4,
    "topk_group": 2,
    "moe_renormalize": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "kda_safe_gate": True,
    "kda_lower_bound": -2.0,
    "rms_norm_eps": 1e-5,
    "rope": {"rope_type": "default", "rope_theta": 50000.0},
    # Its default (156892) lies outside a small vocabulary.
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}
FIXTURES += [
    ("bailing_hybrid_released", BAILING_SPEC,
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "seed": 441, "mtp": True}),
    (
        "bailing_hybrid_recent",
        dict(BAILING_SPEC, q_lora_rank=24, kda_safe_gate=False, num_hidden_layers=4,
             layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
             mlp_layer_types=["dense", "sparse", "sparse", "dense"], rms_norm_eps=1e-6),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 442},
    ),
    # Ling-3.0-flash's kind: routed experts in compressed-tensors INT4
    # (groups of 32 with BF16 scales), the rest BF16; experts 64 wide, so
    # that every row is two groups.
    ("bailing_hybrid_int4", dict(BAILING_SPEC, moe_intermediate_size=64),
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "seed": 443, "int4": True}),
]



# LongCat-Flash (longcat_flash) as released (per-expert weights for the
# computed experts only, rope_theta at the top, `model.mtp.*` after the
# decoder) and as transformers 5.24 writes it (fused experts whose gate/up
# stack also holds the identity experts, rope_parameters with YaRN's
# attention scale, a router bias). Half as many identity experts as
# computed ones, so tokens take both; an `rms_norm_eps` other than the
# latent norms' own 1e-6.
LONGCAT_SPEC = {
    "model_type": "longcat_flash",
    "num_layers": 2,
    "num_attention_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "head_dim": 8,
    "v_head_dim": 16,
    "ffn_hidden_size": 96,
    "expert_ffn_hidden_size": 16,
    "n_routed_experts": 8,
    "zero_expert_num": 4,
    "zero_expert_type": "identity",
    "moe_topk": 3,
    "routed_scaling_factor": 6.0,
    "rms_norm_eps": 1e-5,
    "rope": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
}
FIXTURES += [
    ("longcat_flash_released", LONGCAT_SPEC,
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "seed": 451, "mtp": "longcat",
      "unreloadable": True}),
    (
        "longcat_flash_recent",
        dict(LONGCAT_SPEC, router_bias=True, num_layers=3,
             rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 16},
             max_position_embeddings=64),
        {"style": "new", "layout": "fused", "dtype": "float32", "shards": 1, "seed": 452},
    ),
    # LongCat-Flash-Chat-FP8's kind: every projection (attention, dense
    # MLPs, experts) FP8 with 128x128 block scales, router and norms BF16.
    ("longcat_flash_fp8", dict(LONGCAT_SPEC, expert_ffn_hidden_size=24),
     {"style": "old", "layout": "per_expert", "dtype": "bfloat16", "shards": 2, "seed": 453, "fp8": True,
      "mtp": "longcat"}),
]


def v4_released_name(name: str) -> str:
    if name in V4_TOP_NAMES:
        return V4_TOP_NAMES[name]
    layer, tail = name[len("model.layers."):].split(".", 1)
    for hf, released in V4_LAYER_NAMES:
        if tail.startswith(hf):
            return f"layers.{layer}.{released}{tail[len(hf):]}"
    raise KeyError(name)


def v4_released_tensors(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            layer = k[len("model.layers."):].split(".", 1)[0]
            for e in range(v.shape[0]):
                if k.endswith("down_proj"):
                    out[f"layers.{layer}.ffn.experts.{e}.w2.weight"] = v[e].contiguous()
                else:
                    inter = v.shape[1] // 2
                    out[f"layers.{layer}.ffn.experts.{e}.w1.weight"] = v[e, :inter].contiguous()
                    out[f"layers.{layer}.ffn.experts.{e}.w3.weight"] = v[e, inter:].contiguous()
        else:
            out[v4_released_name(k)] = v
    return out

EXPERT_NAMES = {
    "deepseek_v4": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "glm_moe_dsa": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "glm4_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "dots1": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "hunyuan_v1_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "ernie4_5_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "bailing_hybrid": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "longcat_flash": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "deepseek_v32": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "minimax_m2": ("block_sparse_moe", "w1", "w3", "w2"),
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
    "deepseek_v3": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "kimi_linear": ("block_sparse_moe", "w1", "w3", "w2"),
    "qwen3_next": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "qwen3_5_moe_text": ("mlp", "gate_proj", "up_proj", "down_proj"),
}


ZERO_CENTRED_NORMS = ("Qwen3NextRMSNorm", "Qwen3_5MoeRMSNorm")


def config_json(spec: dict, tok, style: str) -> dict:
    spec = {k: v for k, v in copy.deepcopy(spec).items() if v is not None or k != "linear_attn_config"}
    rope = spec.pop("rope", None)
    kimi = isinstance(tok, kimi_vocab.KimiTokenizer)
    cfg = {
        "vocab_size": tok.get_vocab_size() if kimi else VOCAB,
        "hidden_size": HIDDEN,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": spec.pop("max_position_embeddings", 256),
        "bos_token_id": None,
        "eos_token_id": tok.token_to_id("[EOS]" if kimi else "<|endoftext|>"),
        **spec,
    }
    if rope is None:
        pass
    elif style == "old":
        cfg.update(rope_old_style(rope))
    else:
        cfg["rope_parameters"] = rope
        if cfg["model_type"] == "qwen3_moe":
            cfg["num_local_experts"] = cfg.pop("num_experts")
    return cfg


@torch.no_grad()
def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 1:  # norm weights
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif name.endswith("embed_tokens.weight"):
            p.copy_(EMBED_STD * torch.randn(p.shape, generator=gen))
        else:
            fan_in = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
        if name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    # Zero-centred norms scale by 1 + weight: their weights sit around 0.
    for module in model.modules():
        if type(module).__name__ in ZERO_CENTRED_NORMS:
            module.weight.copy_(0.2 * torch.randn(module.weight.shape, generator=gen))
    for name, b in list(model.named_buffers()) + list(model.named_parameters()):
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.05 * torch.randn(b.shape, generator=gen))
        if name.endswith("tid2eid"):  # DeepSeek-V4's hash routing: distinct experts per token
            experts = model.config.n_routed_experts
            for row in b:
                row.copy_(torch.randperm(experts, generator=gen)[: b.shape[1]])


def checkpoint_tensors(model, cfg: dict, layout: str) -> dict:
    arch = "deepseek_v3" if cfg["model_type"] in ("deepseek_v3", "kimi_k2") else cfg["model_type"]
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    if layout == "fused":
        return state
    if layout == "deepseek_v4_released":
        return v4_released_tensors(state)
    block, gate_name, up_name, down_name = EXPERT_NAMES[arch]
    out = {}
    for k, v in state.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            prefix = k[: -len("mlp.experts.gate_up_proj")] + block + ".experts"
            inter = v.shape[1] // 2
            # LongCat's stack also holds its identity experts, which have no weights released.
            for e in range(state[k.replace("gate_up_proj", "down_proj")].shape[0]):
                out[f"{prefix}.{e}.{gate_name}.weight"] = v[e, :inter].contiguous()
                out[f"{prefix}.{e}.{up_name}.weight"] = v[e, inter:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            prefix = k[: -len("mlp.experts.down_proj")] + block + ".experts"
            for e in range(v.shape[0]):
                out[f"{prefix}.{e}.{down_name}.weight"] = v[e].contiguous()
        elif block != "mlp" and (".mlp.gate." in k or ".mlp.shared_experts." in k
                                 or k.endswith(".mlp.e_score_correction_bias")):
            out[k.replace(".mlp.", f".{block}.")] = v
        elif k.endswith("mlp.gate.moe_statics.e_score_correction_bias"):
            # ERNIE 4.5's PT release keeps the router's bias beside it.
            out[k.replace("mlp.gate.moe_statics.", "mlp.moe_statics.")] = v
        elif ".forget_gate." in k:
            # Kimi-Linear's release keeps the forget gate's tensors in the attention.
            out[k.replace(".forget_gate.", ".")] = v
        elif k.endswith("self_attn.conv1d.weight") and arch in ("kimi_linear", "bailing_hybrid"):
            # ... and convolves q, k and v with three kernels.
            third = v.shape[0] // 3
            for i, part in enumerate(("q", "k", "v")):
                out[k.replace("conv1d", f"{part}_conv1d")] = v[i * third : (i + 1) * third].contiguous()
        else:
            out[k] = v
    if arch == "bailing_hybrid":
        return {ling_name(k): v for k, v in out.items()}
    return out


# Ling 3.0's own names for transformers' (the reverse of its conversion mapping).
LING_NAMES = [
    ("model.embed_tokens.", "model.word_embeddings."),
    (".self_attn.o_proj.", ".attention.dense."),
    (".self_attn.", ".attention."),
    (".mlp.gate.e_score_correction_bias", ".mlp.gate.expert_bias"),
]


def ling_name(k: str) -> str:
    for ours, theirs in LING_NAMES:
        if ours in k:
            return k.replace(ours, theirs)
    return k


FP8_BLOCK = 128
FP8_MAX = 448.0
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# DeepSeek-V3's release stores these linear layers in FP8; embeddings, norms,
# the router and the LM head stay wider.
FP8_LAYERS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fp8_quantize(w: torch.Tensor, ue8m0: bool = False):
    """FP8 e4m3 with one scale per fixed 128x128 block (edge blocks partial):
    returns (fp8, scale_inv, dequantised) with dequantised = fp8 * scale_inv[r//128, c//128].
    With `ue8m0`, each scale is rounded up to a power of two (`scale_fmt: ue8m0`)."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    scale = torch.zeros(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            block = w[i * FP8_BLOCK : (i + 1) * FP8_BLOCK, j * FP8_BLOCK : (j + 1) * FP8_BLOCK]
            scale[i, j] = max(block.abs().max().item(), 1e-12) / FP8_MAX
            if ue8m0:
                scale[i, j] = 2.0 ** math.ceil(math.log2(scale[i, j].item()))
    full = scale.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    q = (w / full).to(torch.float8_e4m3fn)
    return q, scale, q.to(torch.float32) * full


def put_back(params: dict, k: str, deq: torch.Tensor) -> None:
    """Writes the dequantised values of checkpoint tensor `k` into the model,
    so the reference computes on exactly what the file defines."""
    if k in params:
        params[k].copy_(deq)
        return
    # A per-expert tensor of transformers' fused expert parameters.
    prefix, e, part = k.rsplit(".", 3)[0], int(k.split(".")[-3]), k.split(".")[-2]
    if part == "down_proj":
        params[prefix + ".down_proj"][e].copy_(deq)
    else:
        fused = params[prefix + ".gate_up_proj"][e]
        inter = fused.shape[0] // 2
        (fused[:inter] if part == "gate_proj" else fused[inter:]).copy_(deq)


def quantize_fp8(model, tensors: dict, extra_layers=(), ue8m0: bool = False) -> dict:
    """Stores FP8_LAYERS' (and `extra_layers`') weights as FP8 with block
    scales and puts the exact dequantised values back into `model`, so the
    reference computes on them."""
    params = dict(model.named_parameters())
    layers = FP8_LAYERS + tuple(extra_layers)
    out = {}
    for k, v in tensors.items():
        if not (k.endswith(".weight") and k.split(".")[-2] in layers and v.dim() == 2):
            out[k] = v
            continue
        q, scale, deq = fp8_quantize(v.to(torch.float32), ue8m0)
        out[k], out[k + "_scale_inv"] = q, scale
        put_back(params, k, deq)
    return out


# compressed-tensors float-quantized FP8 as llm-compressor writes it (the
# scheme of GLM-4.5's FP8 releases, whose files hold `weight_scale` and
# `input_scale`): scales per output channel for the MLPs and experts, one
# per tensor for attention with static activation scales, dynamic ones
# elsewhere (activations stay f32, as the dequantised reference computes
# them), router and head in BF16.
CT_FP8_WEIGHTS = {"type": "float", "num_bits": 8, "symmetric": True, "dynamic": False, "group_size": None,
                  "observer": "minmax", "observer_kwargs": {}, "block_structure": None, "actorder": None}
CT_FP8_INPUTS = {"type": "float", "num_bits": 8, "symmetric": True, "strategy": "token", "dynamic": True,
                 "group_size": None, "observer": None, "observer_kwargs": {}, "block_structure": None, "actorder": None}
CT_FP8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "kv_cache_scheme": None,
    "ignore": ["lm_head", "re:.*mlp\\.gate$"],
    "config_groups": {
        "group_0": {"targets": ["re:.*mlp.*proj$"], "weights": dict(CT_FP8_WEIGHTS, strategy="channel"),
                    "input_activations": CT_FP8_INPUTS, "output_activations": None, "format": "float-quantized"},
        "group_1": {"targets": ["re:.*self_attn.*proj$"], "weights": dict(CT_FP8_WEIGHTS, strategy="tensor"),
                    "input_activations": dict(CT_FP8_INPUTS, strategy="tensor", dynamic=False),
                    "output_activations": None, "format": "float-quantized"},
    },
}
CT_FP8_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_ct_fp8(model, tensors: dict) -> dict:
    """Stores projections as compressed-tensors FP8 (`weight` e4m3 beside an
    F32 `weight_scale`: `[rows, 1]` in MLPs, `[1]` in attention) and puts
    the dequantised values, fp8 x scale in f32, back into `model`."""
    params = dict(model.named_parameters())
    out = {}
    for k, v in tensors.items():
        if not (k.endswith(".weight") and k.split(".")[-2] in CT_FP8_LAYERS and v.dim() == 2):
            out[k] = v
            continue
        w = v.to(torch.float32)
        if ".self_attn." in k:
            scale = (w.abs().max().clamp(min=1e-12) / FP8_MAX).reshape(1)
        else:
            scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        q = (w / scale).to(torch.float8_e4m3fn)
        out[k], out[k + "_scale"] = q, scale.to(torch.float32)
        if ".self_attn." in k:
            # A calibrated activation scale, read by FP8 kernels only.
            out[k[: -len("weight")] + "input_scale"] = torch.tensor([0.05], dtype=torch.float32)
        put_back(params, k, q.to(torch.float32) * scale)
    return out


INT4_GROUP = 32
# Kimi K2-Thinking's quantization_config, as published.
INT4_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "kv_cache_scheme": None,
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "output_activations": None,
            "weights": {
                "type": "int", "num_bits": 4, "symmetric": True, "strategy": "group", "group_size": INT4_GROUP,
                "actorder": None, "dynamic": False, "observer": "minmax", "observer_kwargs": {}, "block_structure": None,
            },
        }
    },
}


def int4_quantize(w: torch.Tensor):
    """Symmetric INT4 in groups of 32 with BF16 scales, packed as
    compressed-tensors' pack-quantized: returns (packed int32 [rows, cols/8],
    scale bf16 [rows, cols/32], shape int32 [2], dequantised f32). The
    dequantisation is compressed-tensors' own: q in the scale's dtype, times
    the scale (a BF16 product)."""
    rows, cols = w.shape
    groups = w.reshape(rows, cols // INT4_GROUP, INT4_GROUP)
    scale = (groups.abs().amax(-1) / 7.0).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.round(groups / scale.to(torch.float32).unsqueeze(-1)).clamp(-8, 7).to(torch.int8)
    deq = (q.to(torch.bfloat16) * scale.unsqueeze(-1)).to(torch.float32).reshape(rows, cols)
    nibbles = (q.reshape(rows, cols).to(torch.int32) + 8).numpy().astype(np.uint32)
    packed = np.zeros((rows, cols // 8), dtype=np.uint32)
    for i in range(8):
        packed |= nibbles[:, i::8] << (4 * i)
    packed = torch.from_numpy(np.ascontiguousarray(packed).view(np.int32))
    return packed, scale, torch.tensor([rows, cols], dtype=torch.int32), deq


def quantize_int4(model, tensors: dict) -> dict:
    """Stores routed experts as compressed-tensors INT4 (the rest stays as
    it is, as Kimi's `ignore` list says) and puts the dequantised values back
    into `model`."""
    params = dict(model.named_parameters())
    out = {}
    for k, v in tensors.items():
        if not (k.endswith(".weight") and ".experts." in k and v.dim() == 2):
            out[k] = v
            continue
        packed, scale, shape, deq = int4_quantize(v.to(torch.float32))
        out[k + "_packed"], out[k + "_scale"], out[k + "_shape"] = packed, scale, shape
        put_back(params, k, deq)
    return out


MXFP4_BLOCK = 32
FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
# gpt-oss's release keeps these in BF16.
MXFP4_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
}


def mxfp4_quantize(w: torch.Tensor):
    """MXFP4 along the last dimension: returns (blocks uint8 [..., cols/32, 16],
    scales uint8 [..., cols/32]), E2M1 codes low nibble first with E8M0 scales."""
    *lead, cols = w.shape
    g = w.reshape(*lead, cols // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = g.abs().amax(-1).clamp(min=1e-30)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-126, 127)
    scales = (exponent + 127).to(torch.uint8)
    x = g / torch.ldexp(torch.ones_like(amax), exponent.to(torch.int32)).unsqueeze(-1)
    codes = (x.unsqueeze(-1) - FP4_VALUES).abs().argmin(-1).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), scales.contiguous()


def quantize_mxfp4(model, tensors: dict) -> dict:
    """Stores gpt-oss's expert stacks as MXFP4 blocks (output rows, blocks
    along the reduction) and puts transformers' own dequantisation of them
    back into `model`."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    params = dict(model.named_parameters())
    out = {}
    for k, v in tensors.items():
        if not k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            out[k] = v
            continue
        blocks, scales = mxfp4_quantize(v.to(torch.float32).transpose(1, 2))
        out[k + "_blocks"], out[k + "_scales"] = blocks, scales
        deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert deq.shape == v.shape, (k, deq.shape, v.shape)
        params[k].copy_(deq)
    return out


def e8m0_scales(amax: torch.Tensor, top: float) -> torch.Tensor:
    """Powers of two that bring `amax` within `top`: 2^ceil(log2(amax / top))."""
    return torch.exp2(torch.ceil(torch.log2(amax.clamp(min=1e-30) / top)))


def fp8_e8m0_quantize(w: torch.Tensor):
    """FP8 e4m3 with a power-of-two scale per fixed 128x128 block, as
    DeepSeek-V4 publishes: returns (fp8, e8m0 scales, dequantised)."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    amax = torch.zeros(br, bc)
    for i in range(br):
        for j in range(bc):
            amax[i, j] = w[i * FP8_BLOCK : (i + 1) * FP8_BLOCK, j * FP8_BLOCK : (j + 1) * FP8_BLOCK].abs().max()
    scale = e8m0_scales(amax, FP8_MAX)
    full = scale.repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    q = (w / full).to(torch.float8_e4m3fn)
    return q, scale.to(torch.float8_e8m0fnu), q.to(torch.float32) * full


def fp4_quantize(w: torch.Tensor):
    """E2M1 with a power-of-two scale per 32 weights of a row, two values a
    byte (low nibble first), as DeepSeek-V4 publishes its experts: returns
    (int8 [rows, cols/2], e8m0 scales [rows, cols/32], dequantised)."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // MXFP4_BLOCK, MXFP4_BLOCK)
    scale = e8m0_scales(g.abs().amax(-1), 6.0)
    codes = (g.unsqueeze(-1) / scale[..., None, None] - FP4_VALUES).abs().argmin(-1)
    deq = (FP4_VALUES[codes] * scale[..., None]).reshape(rows, cols)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8).reshape(rows, cols // 2)
    return packed.view(torch.int8), scale.to(torch.float8_e8m0fnu), deq


def quantize_v4(model, tensors: dict) -> dict:
    """DeepSeek-V4's released formats over released names, with the exact
    dequantised values put back into `model`."""
    params = dict(model.named_parameters())
    to_hf = {v4_released_name(k): k for k in params if ".mlp.experts." not in k}
    out = {}
    for k, v in tensors.items():
        expert = re.fullmatch(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight", k)
        if expert:
            packed, scale, deq = fp4_quantize(v.to(torch.float32))
            # transformers' own unpacking of the stored bytes must agree.
            from transformers.integrations.finegrained_fp8 import Fp8Dequantize
            theirs = Fp8Dequantize(None)._unpack_fp4(packed) * scale.to(torch.float32).repeat_interleave(
                MXFP4_BLOCK, 1)
            assert torch.equal(theirs, deq), k
            out[k], out[k[: -len("weight")] + "scale"] = packed, scale
            layer, e, w = expert.groups()
            part = "down_proj" if w == "w2" else "gate_up_proj"
            fused = params[f"model.layers.{layer}.mlp.experts.{part}"][int(e)]
            inter = fused.shape[0] // 2
            {"w1": fused[:inter], "w3": fused[inter:], "w2": fused}[w].copy_(deq)
        elif k.endswith(".weight") and k.split(".")[-2] in V4_FP8_LAYERS and "compressor" not in k:
            q, scale, deq = fp8_e8m0_quantize(v.to(torch.float32))
            out[k], out[k[: -len("weight")] + "scale"] = q, scale
            params[to_hf[k]].copy_(deq)
        else:
            out[k] = v
    return out


def with_mtp_layer(tensors: dict, cfg: dict) -> dict:
    """The release's multi-token-prediction layer, at index num_hidden_layers
    (DeepSeek-V3, V3.2, GLM): the last layer's tensors again (its scales
    too), plus the block's own projections, norms, head and embedding. The
    reference ignores it, and so must Longhaul."""
    n = cfg["num_hidden_layers"]
    last, mtp = f"model.layers.{n - 1}.", f"model.layers.{n}."
    out = dict(tensors)
    for k, v in tensors.items():
        if k.startswith(last):
            out[mtp + k[len(last):]] = v.clone()
    gen = torch.Generator().manual_seed(n)
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    for name, shape in [
        ("eh_proj.weight", (hidden, 2 * hidden)),
        ("enorm.weight", (hidden,)),
        ("hnorm.weight", (hidden,)),
        ("shared_head.norm.weight", (hidden,)),
        ("shared_head.head.weight", (vocab, hidden)),
        ("embed_tokens.weight", (vocab, hidden)),
    ]:
        out[mtp + name] = torch.randn(shape, generator=gen)
    return out


def with_longcat_mtp(tensors: dict) -> dict:
    """LongCat-Flash's MTP block as released, under `model.mtp.`: a copy of
    the first layer's first sublayer and its experts."""
    out = dict(tensors)
    for k, v in tensors.items():
        if k.startswith("model.layers.0."):
            out["model.mtp.layers.0." + k[len("model.layers.0."):]] = v.clone()
    out["model.mtp.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    return out


ERNIE_MTP_NAMES = {"eh_proj": "mtp_linear_proj", "enorm": "mtp_emb_norm", "hnorm": "mtp_hidden_norm"}


def with_ernie_mtp(tensors: dict, cfg: dict) -> dict:
    """ERNIE 4.5's MTP block as its PT releases name it: the decoder layer
    under `model.mtp_block.0.`, its projection and norms as
    `model.mtp_{linear_proj,emb_norm,hidden_norm}.0.weight`."""
    n = cfg["num_hidden_layers"]
    mtp = f"model.layers.{n}."
    out = {}
    for k, v in with_mtp_layer(tensors, cfg).items():
        if not k.startswith(mtp):
            out[k] = v
            continue
        rest = k[len(mtp):]
        part = rest.split(".")[0]
        if part in ERNIE_MTP_NAMES:
            out[f"model.{ERNIE_MTP_NAMES[part]}.0.weight"] = v
        elif part not in ("shared_head", "embed_tokens"):
            out["model.mtp_block.0." + rest] = v
    return out


def save_checkpoint(tensors: dict, out: Path, dtype: torch.dtype, shards: int, prefix: str = "") -> None:
    def stored(k, v):
        # Quantised weights and their scales are written as published.
        published = v.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.int8, torch.int32, torch.int64,
                                torch.uint8) or k.endswith(("_scale_inv", "_scale"))
        return v if published else v.to(dtype)

    tensors = {prefix + k: stored(k, v).contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
        return
    names = sorted(tensors)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, out / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=1)
    )


# The fixtures' byte-level tokenizer, written once: each fixture folder holds
# a relative link to it, as a Hugging Face cache links its snapshots to blobs.
SHARED_TOKENIZER = Path(__file__).resolve().parents[2] / "engine/tests/fixtures/shared/tokenizer.json"


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    """`out/tokenizer.json`: a link to the shared file where the tokenizer is
    the shared one, else the file itself."""
    target = out / "tokenizer.json"
    target.unlink(missing_ok=True)
    text = tok.to_str(pretty=True)
    if SHARED_TOKENIZER.is_file() and SHARED_TOKENIZER.read_text() == text:
        target.symlink_to(os.path.relpath(SHARED_TOKENIZER, out))
    else:
        target.write_text(text)


def write_tokenizer_files(tok: Tokenizer, out: Path, template: bool = True) -> None:
    """The tokenizer files; releases that ship a prompt encoder instead of a
    template (DeepSeek-V3.2, V4) get none."""
    save_tokenizer(tok, out)
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if not template:
        config.pop("chat_template")
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    eos = [tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}, indent=1))


# The least gap between the k-th and the next score at the indexer's cut:
# `torch.topk` orders ties arbitrarily (Longhaul keeps the lowest position),
# so a fixture must not depend on how one is broken. Scores computed in
# another order differ by ~1e-7 relative; the gap must be 100 times that.
MIN_INDEX_GAP = 1e-5


class IndexCutCheck:
    """Checks every top-k the sparse-attention indexers take for near-ties
    at the cut, while active."""

    def __init__(self):
        self.least = math.inf
        self.original = torch.Tensor.topk

    def __enter__(self):
        check = self

        def topk(t, k, *args, **kwargs):
            if t.dtype == torch.float32 and t.dim() == 3:
                ordered = t.sort(dim=-1, descending=True).values.reshape(-1, t.shape[-1])
                for row in ordered:
                    valid = int((row > -1e30).sum())
                    if valid > k:
                        gap = (row[k - 1] - row[k]).item() / max(1.0, abs(row[k - 1].item()))
                        check.least = min(check.least, gap)
            return check.original(t, k, *args, **kwargs)

        torch.Tensor.topk = topk
        return self

    def __exit__(self, *exc):
        torch.Tensor.topk = self.original
        print(f"least relative gap at the indexer cut: {self.least:.2e}")
        if self.least < MIN_INDEX_GAP:
            raise AssertionError(f"indexer scores tie at the cut (relative gap {self.least:.2e})")


def fresh_folder(out: Path) -> None:
    """Empties `out` for a fixture made anew, keeping its `fixture.json`:
    the facts the tests find it by (family, tolerance, the checks that run
    it, what it covers) are written by hand, not by this script."""
    facts = out / "fixture.json"
    kept = facts.read_text() if facts.is_file() else None
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if kept is not None:
        facts.write_text(kept)


@torch.no_grad()
def make_fixture(root: Path, name: str, spec: dict, opts: dict, tok: Tokenizer, seed: int) -> None:
    out = root / name
    fresh_folder(out)
    cfg = config_json(spec, tok, opts["style"])
    if opts.get("tokenizer") == "harmony":
        # As gpt-oss's config says: a turn ends on <|return|>.
        cfg.update(eos_token_id=tok.token_to_id("<|return|>"), pad_token_id=tok.token_to_id("<|endoftext|>"))
    cfg_path = out / "config.json"
    reference_cfg = dict(cfg, model_type=REFERENCE_TYPE.get(cfg["model_type"], cfg["model_type"]))
    cfg_path.write_text(json.dumps(reference_cfg, indent=1))
    # transformers reads the file exactly as a user's checkpoint would be read.
    config = AutoConfig.from_pretrained(out)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    randomize(model, gen)
    if opts.get("script") == "harmony":
        harmony.script(model, tok, gen)
    dtype = getattr(torch, opts["dtype"])
    # Round to the stored precision so the reference computes on the stored values.
    # Only what is saved: rope's inv_freq is a computed buffer and stays f32.
    stored = dict(model.named_parameters())
    stored.update((n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    stored = {n: p for n, p in stored.items() if p.is_floating_point()}
    for p in stored.values():
        p.copy_(p.to(dtype).to(torch.float32))
    # DeepSeek's V3.2 and V4 releases build prompts with their encoders.
    released_encoder = opts["style"] == "old" and cfg["model_type"] in ("deepseek_v32", "deepseek_v4")
    if isinstance(tok, kimi_vocab.KimiTokenizer):
        # As Moonshot publishes it: tiktoken.model, no tokenizer.json; the
        # turn ends on <|im_end|>.
        tok.write(out)
        (out / "generation_config.json").write_text(
            json.dumps({"eos_token_id": [tok.token_to_id("<|im_end|>")], "do_sample": False}, indent=1))
    elif opts.get("tokenizer") == "harmony":
        harmony.write(tok, out, HARMONY_TEMPLATE.read_text())
    else:
        write_tokenizer_files(tok, out, template=not released_encoder)
    tensors = checkpoint_tensors(model, cfg, opts["layout"])
    if opts.get("fp8"):
        tensors = quantize_fp8(model, tensors, opts.get("fp8_extra", ()), opts.get("ue8m0", False))
        fp8_config = dict(FP8_CONFIG, scale_fmt="ue8m0") if opts.get("ue8m0") else FP8_CONFIG
        cfg = dict(cfg, quantization_config=fp8_config)
    if opts.get("ct_fp8"):
        tensors = quantize_ct_fp8(model, tensors)
        cfg = dict(cfg, quantization_config=CT_FP8_CONFIG)
    if opts.get("int4"):
        tensors = quantize_int4(model, tensors)
        cfg = dict(cfg, quantization_config=INT4_CONFIG)
    if opts.get("mxfp4"):
        tensors = quantize_mxfp4(model, tensors)
        cfg = dict(cfg, quantization_config=MXFP4_CONFIG)
    if opts.get("v4_quant"):
        tensors = quantize_v4(model, tensors)
        cfg = dict(cfg, quantization_config=V4_FP8_CONFIG, expert_dtype="fp4")
    if opts.get("mtp") == "ernie":
        tensors = with_ernie_mtp(tensors, cfg)
    elif opts.get("mtp") == "longcat":
        tensors = with_longcat_mtp(tensors)
    elif opts.get("mtp"):
        tensors = with_mtp_layer(tensors, cfg)
    wrapped = opts.get("wrap")
    if wrapped == "llama4":
        # The release's vision tower and projector, which the text model never reads.
        gen_v = torch.Generator().manual_seed(7)
        tensors = dict(tensors)
        tensors["vision_model.patch_embedding.linear.weight"] = torch.randn((32, 48), generator=gen_v)
        tensors["multi_modal_projector.linear_1.weight"] = torch.randn((HIDDEN, 32), generator=gen_v)
        tensors = {("language_model." + k if k.startswith(("model.", "lm_head.")) else k): v
                   for k, v in tensors.items()}
    if wrapped == "qwen3_5_moe":
        tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}
    if opts.get("save_pretrained"):
        # transformers' own writer; only its weights file is kept.
        with tempfile.TemporaryDirectory() as saved:
            model.save_pretrained(saved)
            shutil.copy(Path(saved) / "model.safetensors", out / "model.safetensors")
    else:
        save_checkpoint(tensors, out, dtype, opts["shards"], "language_model." if wrapped == "kimi_k25" else "")

    ids = tok.encode(TEACHER_TEXT).ids
    sparse = cfg["model_type"] in ("glm_moe_dsa", "deepseek_v4", "deepseek_v32")
    cut_check = IndexCutCheck() if sparse else contextlib.nullcontext()
    with cut_check:
        logits = model(torch.tensor([ids])).logits[0]
    prompt_ids = tok.encode(PROMPT_TEXT).ids
    eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    with cut_check:
        generated = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=GREEDY_TOKENS,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )[0, len(prompt_ids) :].tolist()

    # transformers' CPU FP8 dequantisation sizes partial blocks as rows /
    # scale_rows, not the format's fixed 128: its reload is no reference here.
    # INT4 would need compressed-tensors installed to reload; the model above
    # already computes on its dequantised values.
    # MXFP4's loader wants GPU kernels; its dequantisation was run directly above.
    # transformers 5.24 cannot reload LongCat's released per-expert layout:
    # it stacks the 512 computed experts into its 768-expert gate/up parameter.
    reloadable = not opts.get("unreloadable")
    if reloadable and not wrapped and not any(opts.get(q) for q in ("fp8", "ct_fp8", "int4", "mxfp4", "v4_quant")):
        # The checkpoint as written must load back in transformers to the same logits.
        reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
        again = reloaded(torch.tensor([ids])).logits[0]
        # Equal up to kernel-path rounding (a reloaded tensor may take another matmul path).
        drift = (again - logits).abs().max().item()
        assert drift <= RELOAD_TOLERANCE, f"{name}: reload changed logits by {drift}"
    # Now the config as the published checkpoint spells it.
    # As saved: the text config keeps DeepSeek-V3's untied default; the
    # wrapper's own tie_word_embeddings (default true) is left out.
    text_cfg = dict(cfg, tie_word_embeddings=False) if opts.get("saved") else cfg
    final_cfg = {"model_type": wrapped, "text_config": text_cfg} if wrapped else cfg
    # Fields the release spells in a way transformers would not load.
    final_cfg = dict(final_cfg, **opts.get("published", {}))
    for field in opts.get("unpublished", ()):
        final_cfg.pop(field)
    cfg_path.write_text(json.dumps(final_cfg, indent=1))

    chat = {}
    if isinstance(tok, kimi_vocab.KimiTokenizer):
        from transformers.utils.chat_template_utils import render_jinja_template
        rendered = render_jinja_template(
            conversations=[CHAT_MESSAGES], chat_template=kimi_vocab.CHAT_TEMPLATE, add_generation_prompt=True,
            bos_token="[BOS]", eos_token="[EOS]")[0][0]
        chat = {"chat_messages": CHAT_MESSAGES, "chat_text": rendered, "chat_ids": tok.encode(rendered).ids}
    if opts.get("tokenizer") == "harmony":
        chat = harmony_chat(model, tok, eos)
    expected = {
        **chat,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "ids": ids,
        "logits": [[float(x) for x in row] for row in logits],
        "prompt": PROMPT_TEXT,
        "prompt_ids": prompt_ids,
        "greedy_tokens": generated,
        "greedy_text": tok.decode(generated, skip_special_tokens=True),
    }
    (out / "expected.json").write_text(json.dumps(expected))
    print(f"{name}: {len(ids)} positions, greedy {len(generated)} tokens, logit range "
          f"{logits.min():.2f}..{logits.max():.2f}")


# A conversation rendered by a Kimi fixture's template and tokenized by its
# tiktoken vocabulary.
CHAT_MESSAGES = [
    {"role": "user", "content": "Audit the storage engine. 漢字 <|im_end|> stays text?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.read_file:0", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"store.rs\"}"}}]},
    {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "fn read() {}"},
    {"role": "user", "content": "Go on."},
]


# The published gpt-oss template, and the instant its strftime_now reads.
HARMONY_TEMPLATE = Path(__file__).parent / "templates" / "gpt_oss.jinja"
HARMONY_MESSAGES = [{"role": "user", "content": "Audit the storage engine."}]
HARMONY_NOW = 1_780_000_000


@torch.no_grad()
def harmony_chat(model, tok, eos: list) -> dict:
    """A harmony conversation: transformers' render of the published
    template (its clock stopped at HARMONY_NOW), the ids, and greedy
    generation from them, split as harmony's channels split it."""
    import datetime as dt
    from unittest import mock

    from transformers.utils import chat_template_utils
    from transformers.utils.chat_template_utils import render_jinja_template

    class Stopped(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime.fromtimestamp(HARMONY_NOW, tz or dt.timezone.utc).replace(tzinfo=None)

    with mock.patch.object(chat_template_utils, "datetime", Stopped):
        rendered = render_jinja_template(
            conversations=[HARMONY_MESSAGES], chat_template=HARMONY_TEMPLATE.read_text(), add_generation_prompt=True,
        )[0][0]
    ids = tok.encode(rendered).ids
    assert tok.decode(ids, skip_special_tokens=False) == rendered
    out = model.generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=GREEDY_TOKENS,
        do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
    )[0, len(ids):].tolist()
    chain, reasoning, answer = harmony.answer_ids(tok)
    assert out == chain, f"the scripted model answered {out}, not {chain}"
    return {
        "chat_messages": HARMONY_MESSAGES, "chat_now": HARMONY_NOW, "chat_text": rendered, "chat_ids": ids,
        "chat_tokens": out, "chat_reasoning": tok.decode(reasoning), "chat_answer": tok.decode(answer),
    }


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "engine/tests/fixtures")
    only = set(sys.argv[2:])  # fixture names to (re)build; all when none
    root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    tok = build_tokenizer()
    for seed, (name, spec, opts) in enumerate(FIXTURES):
        if not only or name in only:
            fixture_tok = {
                "kimi": kimi_vocab.KimiTokenizer,
                "harmony": lambda: harmony.build_tokenizer(CORPUS, HARMONY_TEMPLATE.read_text()),
            }.get(opts.get("tokenizer"), lambda: tok)()
            make_fixture(root, name, spec, opts, fixture_tok, opts.get("seed", seed + 1))


if __name__ == "__main__":
    main()
