#!/usr/bin/env python3
"""Builds Longhaul's GGUF fixtures and both of their references.

Two tiny random Qwen3-MoE models are written as GGUF files the way llama.cpp
users get them: converted to F32/F16 with the `gguf` package, and quantised
by llama.cpp itself (llama-cpp-python's `llama_model_quantize`), whose own
rules pick each tensor's type. Two more files mix block types per tensor
(blocks copied from llama.cpp's quantisations), so that every supported type
is computed in one of a handful of small files. For each file:

- `transformers`: the exact contract. Every tensor dequantised by the
  `gguf` package's numpy dequantiser, loaded into transformers'
  Qwen3MoeForCausalLM in f32: teacher-forced logits and greedy tokens.
- `llama_cpp`: llama.cpp's own logits for the same ids, which round
  activations inside quantised products (compared by statistics, not 1e-4).
- `tokens`: the ids llama.cpp's tokenizer gives a set of texts.

Run by hand (not in CI):

    ~/.cache/longhaul/refvenv/bin/pip install gguf
    LLAMA_PY=~/.cache/longhaul-peer/venv/bin/python \\
        ~/.cache/longhaul/refvenv/bin/python tools/reference/make_gguf_fixtures.py engine/tests/fixtures/gguf
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import gguf
from gguf.quants import dequantize
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, DeepseekV3Config, GptOssConfig, MixtralConfig, Qwen3MoeConfig

sys.path.insert(0, str(Path(__file__).parent))
import make_fixtures as mf  # noqa: E402

LLAMA_PY = os.environ.get("LLAMA_PY", str(Path.home() / ".cache/longhaul-peer/venv/bin/python"))
LLAMA_REF = str(Path(__file__).parent / "llama_ref.py")
VOCAB = 320
POSITIONS = 16
GREEDY_TOKENS = 12
GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK3_SPLITS = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]
KIMI_K2_SPLIT = (r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
                 r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
                 r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
    "def f(a, b):\n\treturn a ** 2 + b  # 12345 67\n",
    "日本語のテキストと中文字符",
    "emoji 🚀🔥 and accents: café, naïve, Ångström",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "   spaces   and\n\n\nnewlines \r\n end",
    "It's we'll they'd I'M YOU'RE",
]
# name: (model, how the file is made)
FILES = {
    "deepseek2-f32": ("deepseek-small", ("convert", "f32")),
    "deepseek2-q4_k_m": ("deepseek", ("quantize", "Q4_K_M")),
    "mixtral-f32": ("mixtral", ("convert", "f32")),
    "mixtral-q8_0": ("mixtral", ("quantize", "Q8_0")),
    "kimi-k2-f32": ("kimi", ("convert", "f32")),
    "gpt-oss-f32": ("gpt-oss", ("convert", "f32")),
    "gpt-oss-mxfp4": ("gpt-oss", ("quantize", "MXFP4_MOE")),
    "qwen3moe-f32": ("small", ("convert", "f32")),
    "qwen3moe-f16": ("small", ("convert", "f16")),
    "qwen3moe-q4_k_m": ("large", ("quantize", "Q4_K_M")),
    "qwen3moe-kquants": ("large", ("mix", ["Q2_K", "Q3_K_S", "Q4_K_S", "Q5_K_S", "Q6_K"])),
    "qwen3moe-legacy": ("large", ("mix", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])),
    "qwen3moe-iq4": ("large", ("mix", ["IQ4_NL", "IQ4_XS"])),
    "qwen3moe-mxfp4_moe": ("large", ("quantize", "MXFP4_MOE")),
}
MODELS = {
    # hidden 64: rows no k-quant divides; F32 and F16 only.
    "small": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, split="gpt-2"),
    # hidden and expert width 256: every block type divides the rows.
    "large": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  moe_intermediate_size=256, num_experts=4, num_experts_per_tok=2, split="qwen2"),
    # DeepSeek-V3: MLA, one dense layer, grouped sigmoid routing, a shared expert.
    "deepseek": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_attention_heads=4,
                     num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                     n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=64,
                     qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, routed_scaling_factor=2.5,
                     norm_topk_prob=True, split="deepseek-v3"),
    # The same shape at a width no k-quant divides, for F32 (exact against llama.cpp).
    "deepseek-small": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                           num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                           q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
                           v_head_dim=16, routed_scaling_factor=2.5, norm_topk_prob=True, split="deepseek-v3"),
    # Mixtral (`llama` with experts): q/k rows reordered by the converter, a SentencePiece vocabulary.
    "mixtral": dict(hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                    num_local_experts=4, num_experts_per_tok=2, split="spm"),
    # gpt-oss: attention sinks, biases everywhere, alternating sliding layers,
    # YaRN as released (factor 32 over 4096 positions, not truncated).
    "gpt-oss": dict(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    split="gpt-4o"),
    # Kimi K2: DeepSeek-V3's shape with its own split (Han runs apart).
    "kimi": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                 num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                 q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
                 v_head_dim=16, routed_scaling_factor=2.5, norm_topk_prob=True, split="kimi-k2"),
}
# Models are seeded by their place above: add new ones at the end.
DEEPSEEK_NAMES = {  # HF suffix -> GGUF part, per layer
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
LAYERS = 2
# The file also written in parts, and at most how many tensors a part holds.
SPLIT_FROM = "qwen3moe-f16"
SPLIT_TENSORS = 12


class SpmVocab:
    """A SentencePiece-style vocabulary as GGUF stores it: pieces with `▁`
    for spaces, scores (merge order), byte tokens and control tokens."""

    def __init__(self) -> None:
        from tokenizers import SentencePieceBPETokenizer
        trained = SentencePieceBPETokenizer()
        trained.train_from_iterator([mf.CORPUS], vocab_size=SPM_VOCAB, show_progress=False)
        model = json.loads(trained.to_str())["model"]
        merged = ["".join(m) if not isinstance(m, str) else m.replace(" ", "") for m in model["merges"]]
        singles = sorted(t for t in model["vocab"] if len(t) == 1)
        self.tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
        self.types = [2, 3, 3, 3, 3]
        self.scores = [0.0] * 5
        for b in range(256):
            self.tokens.append(f"<0x{b:02X}>"); self.types.append(6); self.scores.append(0.0)
        for i, t in enumerate(singles):
            self.tokens.append(t); self.types.append(1); self.scores.append(-1e4 - i)
        for i, t in enumerate(merged):
            if t not in self.tokens:
                self.tokens.append(t); self.types.append(1); self.scores.append(-float(i))
        self.vocab_size = len(self.tokens)


SPM_VOCAB = 400


def build_tokenizer(split: str):
    if split == "spm":
        return SpmVocab()
    tok = Tokenizer(models.BPE())
    if split in ("qwen2", "gpt-4o", "deepseek-v3", "kimi-k2"):
        regexes = {"qwen2": [QWEN2_SPLIT], "gpt-4o": [GPT4O_SPLIT], "deepseek-v3": DEEPSEEK3_SPLITS,
                   "kimi-k2": [KIMI_K2_SPLIT]}[split]
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=mf.SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([mf.CORPUS], trainer)
    return tok


def hf_model(spec: dict, seed: int, vocab: int = VOCAB):
    spec = {k: v for k, v in spec.items() if k != "split"}
    if "sliding_window" in spec:
        config = GptOssConfig(vocab_size=vocab, num_hidden_layers=LAYERS, max_position_embeddings=131072,
                              tie_word_embeddings=False, **spec)
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        mf.randomize(model, torch.Generator().manual_seed(seed))
        return model
    if "num_local_experts" in spec:
        config = MixtralConfig(vocab_size=vocab, num_hidden_layers=LAYERS, rms_norm_eps=1e-5,
                               max_position_embeddings=256, tie_word_embeddings=False, rope_theta=1e6, **spec)
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        mf.randomize(model, torch.Generator().manual_seed(seed))
        return model
    if "kv_lora_rank" in spec:
        config = DeepseekV3Config(vocab_size=VOCAB, num_hidden_layers=LAYERS, rms_norm_eps=1e-6,
                                  max_position_embeddings=256, tie_word_embeddings=False, **spec)
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        mf.randomize(model, torch.Generator().manual_seed(seed))
        return model
    config = Qwen3MoeConfig(vocab_size=VOCAB, num_hidden_layers=LAYERS, intermediate_size=spec["moe_intermediate_size"],
                            rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=10000.0,
                            norm_topk_prob=True, tie_word_embeddings=False, attention_bias=False, **spec)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    mf.randomize(model, torch.Generator().manual_seed(seed))
    return model


def is_deepseek(model) -> bool:
    return model.config.model_type == "deepseek_v3"


def permute(w, n_head: int):
    """llama.cpp's converter's q/k row order for `llama` (interleaved RoPE pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head: int):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


MIXTRAL_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                 "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                 "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                 "mlp.gate.weight": "ffn_gate_inp.weight"}


GPT_OSS_NAMES = {"input_layernorm.weight": "attn_norm.weight",
                 "post_attention_layernorm.weight": "post_attention_norm.weight",
                 "self_attn.sinks": "attn_sinks.weight", "mlp.router.weight": "ffn_gate_inp.weight",
                 "mlp.router.bias": "ffn_gate_inp.bias"}
for _p, _g in [("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")]:
    for _s in ("weight", "bias"):
        GPT_OSS_NAMES[f"self_attn.{_p}_proj.{_s}"] = f"{_g}.{_s}"


def to_gguf(model, names: dict, special=lambda rest, blk, a: None) -> dict:
    """HF state as GGUF tensors (name -> f32 array) under `names` (HF suffix
    -> GGUF part, per layer), experts stacked with gate and up apart;
    `special(rest, blk, array)` returns the tensors of a part it writes itself."""
    out = {}
    for k, v in model.state_dict().items():
        a = v.detach().float().numpy()
        if k in GLOBAL_NAMES:
            out[GLOBAL_NAMES[k]] = a
            continue
        _, _, layer, rest = k.split(".", 3)
        blk = f"blk.{layer}"
        own = special(rest, blk, a)
        if own is not None:
            out.update(own)
        elif rest == "mlp.experts.gate_up_proj":
            inter = a.shape[1] // 2
            out[f"{blk}.ffn_gate_exps.weight"] = np.ascontiguousarray(a[:, :inter])
            out[f"{blk}.ffn_up_exps.weight"] = np.ascontiguousarray(a[:, inter:])
        elif rest == "mlp.experts.down_proj":
            out[f"{blk}.ffn_down_exps.weight"] = a
        else:
            out[f"{blk}.{names[rest]}"] = np.ascontiguousarray(a)
    return out


def to_state(stored: dict, model, names: dict, special=lambda rest, blk: None) -> dict:
    """The inverse of `to_gguf`: the file's dequantised tensors under the HF
    model's names; `special(rest, blk)` returns a tensor it rebuilds itself."""
    state = {}
    for k in model.state_dict():
        if k in GLOBAL_NAMES:
            state[k] = stored[GLOBAL_NAMES[k]]
            continue
        _, _, layer, rest = k.split(".", 3)
        blk = f"blk.{layer}"
        own = special(rest, blk)
        if own is not None:
            state[k] = own
        elif rest == "mlp.experts.gate_up_proj":
            state[k] = np.concatenate([stored[f"{blk}.ffn_gate_exps.weight"],
                                       stored[f"{blk}.ffn_up_exps.weight"]], axis=1)
        elif rest == "mlp.experts.down_proj":
            state[k] = stored[f"{blk}.ffn_down_exps.weight"]
        else:
            state[k] = stored[f"{blk}.{names[rest]}"]
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


def deepseek_tensors(model) -> dict:
    """kv_b split per head into k_b (transposed) and v_b, as llama.cpp's converter does."""
    cfg = model.config

    def kv_b(rest, blk, a):
        if rest != "self_attn.kv_b_proj.weight":
            return None
        kv = a.reshape(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, -1)
        return {f"{blk}.attn_k_b.weight": np.ascontiguousarray(kv[:, :cfg.qk_nope_head_dim].transpose(0, 2, 1)),
                f"{blk}.attn_v_b.weight": np.ascontiguousarray(kv[:, cfg.qk_nope_head_dim:])}
    return to_gguf(model, DEEPSEEK_NAMES, kv_b)


def deepseek_state(stored: dict, model) -> dict:
    cfg = model.config

    def kv_b(rest, blk):
        if rest != "self_attn.kv_b_proj.weight":
            return None
        k_b = stored[f"{blk}.attn_k_b.weight"].transpose(0, 2, 1)
        return np.concatenate([k_b, stored[f"{blk}.attn_v_b.weight"]], axis=1).reshape(-1, cfg.kv_lora_rank)
    return to_state(stored, model, DEEPSEEK_NAMES, kv_b)


def mixtral_tensors(model) -> dict:
    """q and k rows in llama.cpp's interleaved-RoPE order."""
    cfg = model.config
    heads = {"self_attn.q_proj.weight": cfg.num_attention_heads, "self_attn.k_proj.weight": cfg.num_key_value_heads}

    def qk(rest, blk, a):
        return {f"{blk}.{MIXTRAL_NAMES[rest]}": permute(a, heads[rest])} if rest in heads else None
    return to_gguf(model, MIXTRAL_NAMES, qk)


def mixtral_state(stored: dict, model) -> dict:
    cfg = model.config
    heads = {"self_attn.q_proj.weight": cfg.num_attention_heads, "self_attn.k_proj.weight": cfg.num_key_value_heads}

    def qk(rest, blk):
        return unpermute(stored[f"{blk}.{MIXTRAL_NAMES[rest]}"], heads[rest]) if rest in heads else None
    return to_state(stored, model, MIXTRAL_NAMES, qk)


def gpt_oss_tensors(model) -> dict:
    """Experts transposed to rows of outputs, gate and up de-interleaved,
    biases beside them, as llama.cpp's converter writes gpt-oss."""
    def experts(rest, blk, a):
        if rest == "mlp.experts.gate_up_proj":
            rows = a.transpose(0, 2, 1)
            return {f"{blk}.ffn_gate_exps.weight": np.ascontiguousarray(rows[:, 0::2]),
                    f"{blk}.ffn_up_exps.weight": np.ascontiguousarray(rows[:, 1::2])}
        if rest == "mlp.experts.gate_up_proj_bias":
            return {f"{blk}.ffn_gate_exps.bias": np.ascontiguousarray(a[:, 0::2]),
                    f"{blk}.ffn_up_exps.bias": np.ascontiguousarray(a[:, 1::2])}
        if rest == "mlp.experts.down_proj":
            return {f"{blk}.ffn_down_exps.weight": np.ascontiguousarray(a.transpose(0, 2, 1))}
        if rest == "mlp.experts.down_proj_bias":
            return {f"{blk}.ffn_down_exps.bias": a}
        return None
    return to_gguf(model, GPT_OSS_NAMES, experts)


def gpt_oss_state(stored: dict, model) -> dict:
    def interleave(gate, up, axis):
        both = np.empty(gate.shape[:axis] + (2 * gate.shape[axis],) + gate.shape[axis + 1:], dtype=np.float32)
        index = [slice(None)] * gate.ndim
        index[axis] = slice(0, None, 2)
        both[tuple(index)] = gate
        index[axis] = slice(1, None, 2)
        both[tuple(index)] = up
        return both

    def experts(rest, blk):
        if rest == "mlp.experts.gate_up_proj":
            return interleave(stored[f"{blk}.ffn_gate_exps.weight"], stored[f"{blk}.ffn_up_exps.weight"], 1).transpose(0, 2, 1)
        if rest == "mlp.experts.gate_up_proj_bias":
            return interleave(stored[f"{blk}.ffn_gate_exps.bias"], stored[f"{blk}.ffn_up_exps.bias"], 1)
        if rest == "mlp.experts.down_proj":
            return stored[f"{blk}.ffn_down_exps.weight"].transpose(0, 2, 1)
        if rest == "mlp.experts.down_proj_bias":
            return stored[f"{blk}.ffn_down_exps.bias"]
        return None
    return to_state(stored, model, GPT_OSS_NAMES, experts)


def gpt_oss_metadata(w, cfg) -> None:
    a = "gpt-oss"
    w.add_name("longhaul-fixture")
    for key, value in [("context_length", cfg.max_position_embeddings), ("embedding_length", cfg.hidden_size),
                       ("block_count", cfg.num_hidden_layers), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads),
                       ("attention.head_count_kv", cfg.num_key_value_heads),
                       ("attention.key_length", cfg.head_dim), ("attention.value_length", cfg.head_dim),
                       ("expert_count", cfg.num_local_experts), ("expert_used_count", cfg.num_experts_per_tok),
                       ("expert_feed_forward_length", cfg.intermediate_size),
                       ("attention.sliding_window", cfg.sliding_window),
                       ("rope.scaling.original_context_length",
                        cfg.rope_parameters["original_max_position_embeddings"])]:
        w.add_uint32(f"{a}.{key}", int(value))
    w.add_float32(f"{a}.rope.freq_base", cfg.rope_parameters["rope_theta"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_float32(f"{a}.rope.scaling.factor", cfg.rope_parameters["factor"])


def gguf_tensors(model) -> dict:
    """HF state as GGUF tensors (name -> f32 array), experts stacked."""
    if model.config.model_type == "gpt_oss":
        return gpt_oss_tensors(model)
    if is_deepseek(model):
        return deepseek_tensors(model)
    if model.config.model_type == "mixtral":
        return mixtral_tensors(model)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, LAYERS)
    out = {}
    for k, v in model.state_dict().items():
        a = v.detach().float().numpy()
        if k.endswith("mlp.experts.gate_up_proj"):
            layer = k.split(".")[2]
            inter = a.shape[1] // 2
            out[f"blk.{layer}.ffn_gate_exps.weight"] = np.ascontiguousarray(a[:, :inter])
            out[f"blk.{layer}.ffn_up_exps.weight"] = np.ascontiguousarray(a[:, inter:])
            continue
        if k.endswith("mlp.experts.down_proj"):
            out[f"blk.{k.split('.')[2]}.ffn_down_exps.weight"] = a
            continue
        name = tmap.get_name(k, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise SystemExit(f"no GGUF name for {k}")
        out[name] = a
    return out


def write_gguf(path: Path, model, tok: Tokenizer, split: str, tensors: dict, max_tensors: int = 0) -> None:
    """tensors: name -> (array, raw GGML type or None for float arrays);
    with `max_tensors`, split into parts of at most that many tensors."""
    cfg = model.config
    if is_deepseek(model):
        w = gguf.GGUFWriter(str(path), "deepseek2", split_max_tensors=max_tensors)
        deepseek_metadata(w, cfg)
    elif cfg.model_type == "gpt_oss":
        w = gguf.GGUFWriter(str(path), "gpt-oss", split_max_tensors=max_tensors)
        gpt_oss_metadata(w, cfg)
    elif cfg.model_type == "mixtral":
        w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=max_tensors)
        mixtral_metadata(w, cfg)
    else:
        w = gguf.GGUFWriter(str(path), "qwen3moe", split_max_tensors=max_tensors)
        qwen3moe_metadata(w, cfg)
    add_tokenizer(w, tok, split)
    for name, (array, raw) in tensors.items():
        if raw is None:
            w.add_tensor(name, array)
        else:
            w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mixtral_metadata(w, cfg) -> None:
    a = "llama"
    w.add_name("longhaul-fixture")
    for key, value in [("context_length", cfg.max_position_embeddings), ("embedding_length", cfg.hidden_size),
                       ("block_count", cfg.num_hidden_layers), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads),
                       ("attention.head_count_kv", cfg.num_key_value_heads),
                       ("rope.dimension_count", cfg.hidden_size // cfg.num_attention_heads),
                       ("expert_count", cfg.num_local_experts), ("expert_used_count", cfg.num_experts_per_tok)]:
        w.add_uint32(f"{a}.{key}", int(value))
    w.add_float32(f"{a}.rope.freq_base", 1e6)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)


def deepseek_metadata(w, cfg) -> None:
    a = "deepseek2"
    w.add_name("longhaul-fixture")
    for key, value in [("context_length", cfg.max_position_embeddings), ("embedding_length", cfg.hidden_size),
                       ("block_count", cfg.num_hidden_layers), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads), ("attention.head_count_kv", 1),
                       ("attention.q_lora_rank", cfg.q_lora_rank), ("attention.kv_lora_rank", cfg.kv_lora_rank),
                       ("attention.key_length", cfg.kv_lora_rank + cfg.qk_rope_head_dim),
                       ("attention.value_length", cfg.kv_lora_rank),
                       ("attention.key_length_mla", cfg.qk_nope_head_dim + cfg.qk_rope_head_dim),
                       ("attention.value_length_mla", cfg.v_head_dim),
                       ("rope.dimension_count", cfg.qk_rope_head_dim), ("expert_count", cfg.n_routed_experts),
                       ("expert_used_count", cfg.num_experts_per_tok),
                       ("expert_feed_forward_length", cfg.moe_intermediate_size),
                       ("expert_shared_count", cfg.n_shared_experts),
                       ("leading_dense_block_count", cfg.first_k_dense_replace),
                       ("expert_gating_func", 2), ("expert_group_count", cfg.n_group),
                       ("expert_group_used_count", cfg.topk_group)]:
        w.add_uint32(f"{a}.{key}", int(value))
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_float32(f"{a}.expert_weights_scale", cfg.routed_scaling_factor)
    w.add_bool(f"{a}.expert_weights_norm", bool(cfg.norm_topk_prob))


def qwen3moe_metadata(w, cfg) -> None:
    w.add_name("longhaul-fixture")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)


def add_tokenizer(w, tok, split: str) -> None:
    if isinstance(tok, SpmVocab):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tok.tokens)
        w.add_token_scores(tok.scores)
        w.add_token_types(tok.types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(tok.tokens.index("<|im_end|>"))
        w.add_unk_token_id(0)
        w.add_add_bos_token(False)
        w.add_chat_template(mf.CHAT_TEMPLATE)
        return
    vocab = tok.get_vocab()
    inv = {i: t for t, i in vocab.items()}
    tokens = [inv.get(i, f"[PAD{i}]") for i in range(VOCAB)]
    types = [gguf.TokenType.CONTROL if t in mf.SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    merges = [" ".join(m) if not isinstance(m, str) else m
              for m in json.loads(tok.to_str())["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(split)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.token_to_id("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(mf.CHAT_TEMPLATE)


def read_gguf(path: Path) -> dict:
    """name -> (raw array as stored, GGML type) from a GGUF file."""
    r = gguf.GGUFReader(str(path))
    return {t.name: (np.array(t.data), t.tensor_type) for t in r.tensors}


def dequantized_state(path: Path, model) -> dict:
    """The file's tensors dequantised, under the HF model's names."""
    r = gguf.GGUFReader(str(path))
    stored = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        stored[t.name] = dequantize(np.array(t.data), t.tensor_type).reshape(shape).astype(np.float32)
    if is_deepseek(model):
        return deepseek_state(stored, model)
    if model.config.model_type == "mixtral":
        return mixtral_state(stored, model)
    if model.config.model_type == "gpt_oss":
        return gpt_oss_state(stored, model)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, LAYERS)
    state = {}
    for k in model.state_dict():
        if k.endswith("mlp.experts.gate_up_proj"):
            layer = k.split(".")[2]
            state[k] = np.concatenate([stored[f"blk.{layer}.ffn_gate_exps.weight"],
                                       stored[f"blk.{layer}.ffn_up_exps.weight"]], axis=1)
        elif k.endswith("mlp.experts.down_proj"):
            state[k] = stored[f"blk.{k.split('.')[2]}.ffn_down_exps.weight"]
        else:
            state[k] = stored[tmap.get_name(k, try_suffixes=(".weight", ".bias"))]
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


def llama(*args: str) -> None:
    subprocess.run([LLAMA_PY, LLAMA_REF, *args], check=True)


def mix(sources: dict, order: list) -> dict:
    """Per quantised tensor, the blocks of one source file (each quantised
    `pure`: one type throughout), cycling through `order`; a layer's gate and
    up experts come from the same file. Float tensors stay as they are."""
    first = sources[order[0]]
    quantised = [n for n, (_, t) in first.items()
                 if t != gguf.GGMLQuantizationType.F32 and "ffn_up_exps" not in n]
    out = {}
    for name, value in first.items():
        key = name.replace("ffn_up_exps", "ffn_gate_exps")
        if key in quantised:
            out[name] = sources[order[quantised.index(key) % len(order)]][name]
        else:
            out[name] = value
    return out


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "engine/tests/fixtures/gguf")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="lh-gguf-"))
    teacher_ids = None
    made = {}
    for seed, (kind, spec) in enumerate(MODELS.items(), start=100):
        tok = build_tokenizer(spec["split"])
        model = hf_model(spec, seed, getattr(tok, "vocab_size", VOCAB))
        f32 = {n: (a, None) for n, a in gguf_tensors(model).items()}
        base = tmp / f"{kind}-f32.gguf"
        write_gguf(base, model, tok, spec["split"], f32)
        made[kind] = (model, tok, base)
    for name, (kind, (how, arg)) in FILES.items():
        model, tok, base = made[kind]
        path = out_dir / f"{name}.gguf"
        if how == "convert":
            keep = lambda n, a: arg == "f32" or a.ndim == 1 or "ffn_gate_inp" in n  # as llama.cpp converts
            tensors = {n: (a if keep(n, a) else a.astype(np.float16), None)
                       for n, (a, _) in read_gguf(base).items()}
            write_gguf(path, model, tok, MODELS[kind]["split"], tensors)
        elif how == "quantize":
            llama("quantize", str(base), str(path), arg)
        else:
            sources = {}
            for ftype in arg:
                q = tmp / f"{kind}-{ftype}.gguf"
                llama("quantize", str(base), str(q), ftype, "pure")
                sources[ftype] = read_gguf(q)
            tensors = {n: (a, t if t not in (gguf.GGMLQuantizationType.F32,) else None)
                       for n, (a, t) in mix(sources, arg).items()}
            write_gguf(path, model, tok, MODELS[kind]["split"], tensors)
        reference(path, model, tok)
        types = sorted({t.name for _, t in read_gguf(path).values()})
        print(f"{name}: {path.stat().st_size} bytes, types {types}")
        if name == SPLIT_FROM:
            # The same tensors in parts, as llama.cpp's gguf-split writes them.
            split_dir = out_dir / "split"
            shutil.rmtree(split_dir, ignore_errors=True)
            split_dir.mkdir()
            write_gguf(split_dir / f"{name}.gguf", model, tok, MODELS[kind]["split"], tensors, SPLIT_TENSORS)
            print("split:", sorted(p.name for p in split_dir.iterdir()))
    shutil.rmtree(tmp)


@torch.no_grad()
def reference(path: Path, model, tok: Tokenizer) -> None:
    ref = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval()
    ref.load_state_dict(dequantized_state(path, model), strict=True)
    tmp = Path(tempfile.mkdtemp(prefix="lh-ref-"))
    if isinstance(tok, SpmVocab):  # no Python SentencePiece here: llama.cpp's ids
        (tmp / "both.json").write_text(json.dumps([mf.TEACHER_TEXT, mf.PROMPT_TEXT]))
        llama("tokenize", str(path), str(tmp / "both.json"), str(tmp / "both-ids.json"))
        ids, prompt_ids = json.loads((tmp / "both-ids.json").read_text())["ids"]
        ids = ids[:POSITIONS]
    else:
        ids = tok.encode(mf.TEACHER_TEXT).ids[:POSITIONS]
        prompt_ids = tok.encode(mf.PROMPT_TEXT).ids
    logits = ref(torch.tensor([ids])).logits[0]
    generated = ref.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             max_new_tokens=GREEDY_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=GREEDY_TOKENS)[0, len(prompt_ids):].tolist()
    if isinstance(tok, SpmVocab):
        (tmp / "greedy.json").write_text(json.dumps(generated))
        llama("detokenize", str(path), str(tmp / "greedy.json"), str(tmp / "greedy-text.json"))
        greedy_text = json.loads((tmp / "greedy-text.json").read_text())["text"]
    else:
        greedy_text = tok.decode(generated, skip_special_tokens=True)
    (tmp / "ids.json").write_text(json.dumps(ids))
    (tmp / "texts.json").write_text(json.dumps(TEXTS))
    llama("logits", str(path), str(tmp / "ids.json"), str(tmp / "logits.json"))
    llama("tokenize", str(path), str(tmp / "texts.json"), str(tmp / "tokens.json"))
    llama_logits = json.loads((tmp / "logits.json").read_text())
    tokens = json.loads((tmp / "tokens.json").read_text())
    expected = {
        "transformers_version": __import__("transformers").__version__,
        "llama_cpp_version": llama_logits["llama_cpp_version"],
        "ids": ids,
        "logits": [[float(x) for x in row] for row in logits],
        "llama_cpp_logits": llama_logits["logits"],
        "prompt": mf.PROMPT_TEXT,
        "prompt_ids": prompt_ids,
        "greedy_tokens": generated,
        "greedy_text": greedy_text,
        "texts": TEXTS,
        "llama_cpp_tokens": tokens["ids"],
    }
    path.with_suffix(".json").write_text(json.dumps(expected))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
