#!/usr/bin/env python3
"""Randomised check of `longhaul logits` against transformers.

Draws checkpoint configurations from the whole option space of each supported
family (not just the committed fixtures), builds each with transformers, and
compares `longhaul logits --json` with transformers' logits. Prints one JSON
line per checkpoint and a summary; exits non-zero if any differs by more
than 1e-4.

    ~/.cache/longhaul/refvenv/bin/python tools/reference/spot_check.py \\
        --longhaul ~/.cache/longhaul/target/release/longhaul --count 30
"""

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import make_fixtures as fx

TOLERANCE = 1e-4


def rope(rng: random.Random, allow_scaled: bool = True) -> dict:
    theta = rng.choice([10000.0, 50000.0, 1000000.0])
    kind = rng.choice(["default", "linear", "yarn"] if allow_scaled else ["default"])
    if kind == "default":
        return {"rope_type": "default", "rope_theta": theta}
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": rng.choice([2.0, 4.0])}
    out = {"rope_type": "yarn", "rope_theta": theta, "factor": rng.choice([2.0, 8.0, 40.0]),
           "original_max_position_embeddings": rng.choice([8, 16, 32])}
    if rng.random() < 0.5:
        out["mscale"] = rng.choice([0.7, 1.0])
        out["mscale_all_dim"] = rng.choice([0.7, 1.0])
    if rng.random() < 0.5:
        out["beta_fast"] = rng.choice([4.0, 16.0, 32.0])
        out["beta_slow"] = rng.choice([1.0, 2.0])
    return out


def qwen3(rng: random.Random) -> dict:
    heads = rng.choice([2, 4, 8])
    experts = rng.choice([4, 8, 16])
    layers = rng.randint(1, 4)
    window = rng.random() < 0.3
    return {
        "model_type": "qwen3_moe",
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": rng.choice([k for k in (1, 2, heads) if heads % k == 0]),
        **({"head_dim": rng.choice([8, 16, 24])} if rng.random() < 0.7 else {}),
        "attention_bias": rng.random() < 0.3,
        "intermediate_size": rng.choice([32, 96]),
        "moe_intermediate_size": rng.choice([16, 40]),
        "num_experts": experts,
        "num_experts_per_tok": rng.randint(1, min(4, experts)),
        "norm_topk_prob": rng.random() < 0.5,
        "decoder_sparse_step": rng.choice([1, 1, 2]),
        "mlp_only_layers": sorted(rng.sample(range(layers), rng.randint(0, layers - 1))) if layers > 1 else [],
        "use_sliding_window": window,
        "sliding_window": rng.choice([3, 7, 20]),
        "rope": rope(rng),
        "max_position_embeddings": 128,
        "tie_word_embeddings": rng.random() < 0.3,
    }


def mixtral(rng: random.Random) -> dict:
    heads = rng.choice([2, 4])
    experts = rng.choice([4, 8])
    scaled_rope = rope(rng)
    # transformers' YaRN needs an explicit head_dim for Mixtral.
    head_dim = {"head_dim": rng.choice([8, 32])} if rng.random() < 0.5 or scaled_rope["rope_type"] == "yarn" else {}
    return {
        "model_type": "mixtral",
        "num_hidden_layers": rng.randint(1, 3),
        "num_attention_heads": heads,
        "num_key_value_heads": rng.choice([k for k in (1, 2, heads) if heads % k == 0]),
        **head_dim,
        "intermediate_size": rng.choice([24, 64]),
        "num_local_experts": experts,
        "num_experts_per_tok": rng.randint(1, min(3, experts)),
        **({"sliding_window": rng.choice([2, 5, 11])} if rng.random() < 0.5 else {}),
        "rope": scaled_rope,
        "max_position_embeddings": 128,
        "tie_word_embeddings": rng.random() < 0.3,
    }


def deepseek(rng: random.Random) -> dict:
    groups = rng.choice([1, 2, 4])
    experts = groups * rng.choice([2, 4])
    topk_group = rng.randint(1, groups)
    layers = rng.randint(1, 3)
    heads = rng.choice([1, 2, 4])
    return {
        "model_type": rng.choice(["deepseek_v3", "kimi_k2"]),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        # transformers defaults this to 128, which breaks its MLA for fewer heads.
        "num_key_value_heads": heads,
        "q_lora_rank": rng.choice([None, 16, 48]),
        "kv_lora_rank": rng.choice([8, 32]),
        "qk_nope_head_dim": rng.choice([8, 16]),
        "qk_rope_head_dim": rng.choice([4, 8, 16]),
        "v_head_dim": rng.choice([8, 12]),
        "attention_bias": rng.random() < 0.3,
        "intermediate_size": rng.choice([32, 80]),
        "moe_intermediate_size": rng.choice([8, 24]),
        "n_routed_experts": experts,
        "n_shared_experts": rng.choice([0, 1, 2]) if rng.random() < 0.9 else 1,
        "num_experts_per_tok": rng.randint(1, experts // groups * topk_group),
        "n_group": groups,
        "topk_group": topk_group,
        "norm_topk_prob": rng.random() < 0.5,
        "routed_scaling_factor": rng.choice([1.0, 2.5]),
        "first_k_dense_replace": rng.randint(0, layers),
        "rope_interleave": rng.random() < 0.5,
        "rope": rope(rng),
        "max_position_embeddings": 128,
        "tie_word_embeddings": rng.random() < 0.2,
    }


def layer_kinds(rng: random.Random, layers: int) -> list:
    # At least one of each: transformers' generate needs an attention layer.
    kinds = [rng.choice(["linear_attention", "full_attention"]) for _ in range(layers)]
    first = rng.randrange(layers)
    kinds[first] = "linear_attention"
    kinds[(first + 1) % layers] = "full_attention"
    return kinds


def kimi_linear(rng: random.Random) -> dict:
    groups = rng.choice([1, 2])
    experts = groups * rng.choice([4, 8])
    topk_group = rng.randint(1, groups)
    layers = rng.randint(2, 5)
    heads = rng.choice([1, 2, 4])
    lin_heads, lin_dim = rng.choice([1, 2, 4]), rng.choice([8, 16, 24])
    spec = {
        "model_type": "kimi_linear",
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": rng.choice([None, 16]),
        "kv_lora_rank": rng.choice([8, 32]),
        "qk_nope_head_dim": rng.choice([8, 16]),
        "qk_rope_head_dim": rng.choice([4, 8]),
        "v_head_dim": rng.choice([8, 12]),
        "intermediate_size": rng.choice([32, 80]),
        "moe_intermediate_size": rng.choice([8, 24]),
        "num_experts": experts,
        "num_experts_per_token": rng.randint(1, experts // groups * topk_group),
        "num_shared_experts": rng.choice([1, 2]),
        "num_expert_group": groups,
        "topk_group": topk_group,
        "moe_renormalize": rng.random() < 0.5,
        "routed_scaling_factor": rng.choice([1.0, 2.446]),
        "rope": None,
        "pad_token_id": 0,
        # transformers' Kimi-Linear never ties its head (no `_tied_weights_keys`).
        "tie_word_embeddings": False,
    }
    kinds = layer_kinds(rng, layers)
    if rng.random() < 0.5:
        spec["linear_attn_config"] = {
            "head_dim": lin_dim, "num_heads": lin_heads, "short_conv_kernel_size": rng.choice([2, 3, 4]),
            "kda_layers": [i + 1 for i, k in enumerate(kinds) if k == "linear_attention"],
            "full_attn_layers": [i + 1 for i, k in enumerate(kinds) if k == "full_attention"],
        }
        spec["first_k_dense_replace"] = rng.randint(0, layers)
    else:
        spec.update(linear_num_heads=lin_heads, linear_head_dim=lin_dim,
                    linear_conv_kernel_dim=rng.choice([2, 3, 4]), layer_types=kinds,
                    mlp_layer_types=[rng.choice(["dense", "sparse"]) for _ in range(layers)])
    return spec


def qwen3_next(rng: random.Random) -> dict:
    layers = rng.randint(2, 4)
    heads = rng.choice([2, 4])
    k_heads = rng.choice([1, 2])
    experts = rng.choice([4, 8])
    qwen3_5 = rng.random() < 0.4
    head_dim = rng.choice([16, 32])
    partial = rng.choice([0.25, 0.5, 1.0])
    spec = {
        "model_type": "qwen3_5_moe_text" if qwen3_5 else "qwen3_next",
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": rng.choice([k for k in (1, 2, heads) if heads % k == 0]),
        "head_dim": head_dim,
        "attention_bias": False,
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": k_heads * rng.choice([1, 2]),
        "linear_key_head_dim": rng.choice([8, 16]),
        "linear_value_head_dim": rng.choice([8, 12]),
        "linear_conv_kernel_dim": rng.choice([2, 4]),
        "moe_intermediate_size": rng.choice([8, 16]),
        "shared_expert_intermediate_size": rng.choice([8, 24]),
        "num_experts": experts,
        "num_experts_per_tok": rng.randint(1, experts),
        "layer_types": layer_kinds(rng, layers),
        "rope": {"rope_type": "default", "rope_theta": rng.choice([10000.0, 1000000.0]),
                 "partial_rotary_factor": partial},
        "tie_word_embeddings": rng.random() < 0.2,
    }
    if not qwen3_5:
        spec.update(intermediate_size=rng.choice([32, 64]), norm_topk_prob=rng.random() < 0.5,
                    decoder_sparse_step=rng.choice([1, 2]), mlp_only_layers=[])
    return spec


FAMILIES = {"qwen3_moe": qwen3, "mixtral": mixtral, "deepseek_v3": deepseek,
            "kimi_linear": kimi_linear, "qwen3_next": qwen3_next}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--longhaul", required=True)
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="write the checkpoints here instead of a temporary folder")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, from " + ", ".join(FAMILIES))
    args = ap.parse_args()
    families = [FAMILIES[f] for f in args.families.split(",")]
    rng = random.Random(args.seed)
    tok = fx.build_tokenizer()
    worst, failures, skipped = 0.0, 0, 0
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        for i in range(args.count):
            spec = families[i % len(families)](rng)
            if spec["model_type"] == "deepseek_v3" and spec["n_shared_experts"] == 0:
                spec["n_shared_experts"] = 1  # transformers' DeepSeek-V3 always builds shared experts
            opts = {
                # Old-style rope fields drop partial rotary (Qwen3-Next's is top-level then).
                "style": rng.choice(["old", "new"]) if spec["rope"] and "partial_rotary_factor" not in spec["rope"] else "new",
                "layout": rng.choice(["per_expert", "fused"]),
                "dtype": rng.choice(["float32", "bfloat16", "float16"]),
                "shards": rng.choice([1, 1, 2]),
            }
            name = f"check_{i:03d}"
            try:
                fx.make_fixture(Path(tmp), name, spec, opts, tok, 1000 + i)
            except Exception as e:  # noqa: BLE001 - the reference itself cannot build this one
                print(json.dumps({"name": name, "spec": spec, "skipped": f"transformers failed: {e}"}))
                skipped += 1
                continue
            exp = json.loads((Path(tmp) / name / "expected.json").read_text())
            out = subprocess.run(
                [args.longhaul, "logits", "--model", str(Path(tmp) / name), "--ids",
                 ",".join(map(str, exp["ids"])), "--json"],
                capture_output=True, text=True,
            )
            if out.returncode != 0:
                print(json.dumps({"name": name, "spec": spec, "opts": opts, "error": out.stderr.strip()}))
                failures += 1
                continue
            got = json.loads(out.stdout)["logits"]
            diff = max(abs(a - b) for ra, rb in zip(got, exp["logits"]) for a, b in zip(ra, rb))
            worst = max(worst, diff)
            ok = diff <= TOLERANCE
            failures += not ok
            print(json.dumps({"name": name, "model_type": spec["model_type"],
                              "rope": (spec["rope"] or {}).get("rope_type"),
                              **opts, "max_abs_diff": diff, "ok": ok}), flush=True)
    print(json.dumps({"checked": args.count - skipped, "skipped": skipped, "failures": failures,
                      "worst_max_abs_diff": worst}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
