#!/usr/bin/env python3
"""Decode speed of transformers on a random DeepSeek-V3-shaped checkpoint.

Writes the checkpoint (with the fixtures' tokenizer) to the given folder so that
`longhaul run` can be timed on the very same weights, then prints one JSON
object with transformers' prefill and decode tokens/s on one thread.

    ~/.cache/longhaul/refvenv/bin/python tools/reference/bench_decode.py /tmp/lh-bench [PROMPT_TOKENS]
    RAYON_NUM_THREADS=1 longhaul run --model /tmp/lh-bench --prompt "..." --max-tokens 64

An existing checkpoint in the folder is reused, so runs with several prompt
lengths time the same weights.
"""

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

DEFAULT_PROMPT_TOKENS = 32
DECODE_TOKENS = 64

CONFIG = {
    "model_type": "deepseek_v3",
    "vocab_size": 512,
    "hidden_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 256,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "intermediate_size": 2048,
    "moe_intermediate_size": 512,
    "n_routed_experts": 32,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "n_group": 4,
    "topk_group": 2,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "eos_token_id": None,
    "bos_token_id": None,
}


@torch.no_grad()
def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/lh-bench")
    prompt_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_PROMPT_TOKENS
    if (out / "model.safetensors").is_file():
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    else:
        model = write_checkpoint(out)
    time_decode(model, prompt_tokens)


def write_checkpoint(out: Path):
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1))
    fixture = Path(__file__).resolve().parents[2] / "engine/tests/fixtures/deepseek_v3_released"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(fixture / name, out / name)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(out)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape))
        else:
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    return model


@torch.no_grad()
def time_decode(model, prompt_tokens: int) -> None:
    torch.set_num_threads(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, prompt_tokens))
    start = time.perf_counter()
    res = model(ids, use_cache=True)
    prefill = time.perf_counter() - start
    cache = res.past_key_values
    token = res.logits[:, -1].argmax(-1, keepdim=True)
    start = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        res = model(token, past_key_values=cache, use_cache=True)
        cache = res.past_key_values
        token = res.logits[:, -1].argmax(-1, keepdim=True)
    decode = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "implementation": "transformers",
        "threads": 1,
        "parameters": params,
        "prompt_tokens": prompt_tokens,
        "prefill_tok_s": prompt_tokens / prefill,
        "decode_tokens": DECODE_TOKENS,
        "decode_tok_s": DECODE_TOKENS / decode,
    }))


if __name__ == "__main__":
    main()
