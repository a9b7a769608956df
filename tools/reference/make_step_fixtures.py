#!/usr/bin/env python3
"""Builds the Step-3.5/3.7 reference fixtures from transformers.

transformers runs Step only as `Step3p7ForConditionalGeneration` (a vision
tower around the text model), which `make_fixtures.py`'s causal-LM path
cannot build, so this script builds it and reuses that script's tokenizer,
weight drawing and expectations. Two fixtures:

- `step3p7_saved`: the wrapper config and `save_pretrained`'s own files
  (text model under `model.language_model.`, fused experts).
- `step3p5_released`: Step-3.5-Flash's layout, the same text model under a
  flat `step3p5` config in the release's legacy fields (per-layer
  `rope_theta` and `partial_rotary_factors` padded with the MTP layer,
  `attention_other_setting`, `moe_layers_enum`, `swigluoai`) and names
  (`moe.gate_proj` stacks of `[E, I, H]`, `moe.router_bias`,
  `share_expert`), with its MTP layer after the decoder.

Run by hand, like make_fixtures.py:

    python tools/reference/make_step_fixtures.py engine/tests/fixtures
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers.models.step3p7.configuration_step3p7 import Step3p7Config
from transformers.models.step3p7.modeling_step3p7 import Step3p7ForConditionalGeneration

import make_fixtures as mf

mf.ZERO_CENTRED_NORMS = mf.ZERO_CENTRED_NORMS + ("Step3p7RMSNorm",)

LAYERS = 5
# Full attention on the first and last layers, sliding between, as the
# release alternates them; sliding layers have more query heads.
LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
FULL_ROPE = {"rope_type": "llama3", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5, "factor": 2.0,
             "low_freq_factor": 1.0, "high_freq_factor": 32.0, "original_max_position_embeddings": 16}
SLIDING_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
# Clamps small enough to bite on the last layers, as the release clamps its last two.
LIMITS = [0.0, 0.0, 0.0, 0.6, 0.6]
SHARED_LIMITS = [0.0, 0.0, 0.0, 0.0, 0.8]
TEXT = {
    "vocab_size": mf.VOCAB,
    "hidden_size": mf.HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_sliding_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "share_expert_dim": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "moe_router_scaling_factor": 3.0,
    "layer_types": LAYER_TYPES,
    "mlp_layer_types": ["dense", "dense", "sparse", "sparse", "sparse"],
    "sliding_window": 6,
    "query_pre_attn_scalar": 20,
    "swiglu_limits": LIMITS,
    "swiglu_limits_shared": SHARED_LIMITS,
    "rope_parameters": {"full_attention": FULL_ROPE, "sliding_attention": SLIDING_ROPE},
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}
VISION = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}


def released_config(eos: int) -> dict:
    """The text config as Step-3.5-Flash's config.json spells it."""
    pad = lambda values, extra: values + [extra]  # noqa: E731  (the MTP layer's entry)
    theta = [FULL_ROPE["rope_theta"] if t == "full_attention" else SLIDING_ROPE["rope_theta"] for t in LAYER_TYPES]
    partial = [FULL_ROPE["partial_rotary_factor"] if t == "full_attention" else 1.0 for t in LAYER_TYPES]
    scaling = {k: v for k, v in FULL_ROPE.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "vocab_size": mf.VOCAB,
        "hidden_size": mf.HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 4,
        "num_attention_groups": 2,
        "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 6,
                                    "num_attention_groups": 2, "head_dim": 16},
        "head_dim": 16,
        "intermediate_size": 96,
        "moe_intermediate_size": 16,
        "share_expert_dim": 24,
        "moe_num_experts": 8,
        "moe_top_k": 3,
        "moe_router_activation": "sigmoid",
        "moe_router_scaling_factor": 3.0,
        "norm_expert_weight": True,
        "use_moe_router_bias": True,
        "use_head_wise_attn_gate": True,
        "moe_layers_enum": "2,3,4",
        "layer_types": pad(LAYER_TYPES, "full_attention"),
        "sliding_window": 6,
        "query_pre_attn_scalar": 20,
        "swiglu_limits": pad(LIMITS, 0.0),
        "swiglu_limits_shared": pad(SHARED_LIMITS, 0.0),
        "rope_theta": pad(theta, FULL_ROPE["rope_theta"]),
        "partial_rotary_factors": pad(partial, 0.5),
        "rope_scaling": scaling,
        "hidden_act": "swigluoai",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": 0,
    }


# The text model's names as transformers holds them -> as the release names them.
RELEASED_NAMES = [
    ("model.language_model.", "model."),
    (".mlp.gate.e_score_correction_bias", ".moe.router_bias"),
    (".mlp.gate.weight", ".moe.gate.weight"),
    (".mlp.shared_experts.", ".share_expert."),
]


def released_tensors(state: dict) -> dict:
    """Text tensors under the release's names: fused experts split into
    `moe.{gate,up,down}_proj.weight` stacks, the vision tower left out, an
    MTP layer (a copy of the last layer plus its own parts) appended."""
    out = {}
    for k, v in state.items():
        if not k.startswith(("model.language_model.", "lm_head.")):
            continue
        name = k
        for held, released in RELEASED_NAMES:
            name = name.replace(held, released)
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name[: -len(".mlp.experts.gate_up_proj")]
            inter = v.shape[1] // 2
            out[f"{base}.moe.gate_proj.weight"] = v[:, :inter].contiguous()
            out[f"{base}.moe.up_proj.weight"] = v[:, inter:].contiguous()
        elif name.endswith(".mlp.experts.down_proj"):
            out[name.replace(".mlp.experts.down_proj", ".moe.down_proj.weight")] = v
        else:
            out[name] = v
    return mf.with_mtp_layer(out, {"num_hidden_layers": LAYERS, "hidden_size": mf.HIDDEN, "vocab_size": mf.VOCAB})


@torch.no_grad()
def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "engine/tests/fixtures")
    torch.set_num_threads(1)
    tok = mf.build_tokenizer()
    eos = tok.token_to_id("<|endoftext|>")
    config = Step3p7Config(text_config=dict(TEXT, eos_token_id=eos), vision_config=VISION)
    config._attn_implementation = "eager"
    model = Step3p7ForConditionalGeneration(config).eval().to(torch.float32)
    mf.randomize(model, torch.Generator().manual_seed(501))
    ids = tok.encode(mf.TEACHER_TEXT).ids
    logits = model(input_ids=torch.tensor([ids])).logits[0]
    prompt = tok.encode(mf.PROMPT_TEXT).ids
    stops = [eos, tok.token_to_id("<|im_end|>")]
    generated = model.generate(
        torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=mf.GREEDY_TOKENS, do_sample=False, eos_token_id=stops, pad_token_id=eos,
    )[0, len(prompt):].tolist()
    expected = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "ids": ids,
        "logits": [[float(x) for x in row] for row in logits],
        "prompt": mf.PROMPT_TEXT,
        "prompt_ids": prompt,
        "greedy_tokens": generated,
        "greedy_text": tok.decode(generated, skip_special_tokens=True),
    }
    for name in ("step3p7_saved", "step3p5_released"):
        out = root / name
        mf.fresh_folder(out)
        mf.write_tokenizer_files(tok, out)
        (out / "expected.json").write_text(json.dumps(expected))
    saved = root / "step3p7_saved"
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        shutil.copy(Path(tmp) / "model.safetensors", saved / "model.safetensors")
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        (saved / "config.json").write_text(json.dumps(cfg, indent=1))
        reloaded = Step3p7ForConditionalGeneration.from_pretrained(tmp, dtype=torch.float32,
                                                                   attn_implementation="eager")
        drift = (reloaded(input_ids=torch.tensor([ids])).logits[0] - logits).abs().max().item()
        assert drift <= mf.RELOAD_TOLERANCE, f"reload changed logits by {drift}"
    released = root / "step3p5_released"
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    mf.save_checkpoint(released_tensors(state), released, torch.float32, 2)
    (released / "config.json").write_text(json.dumps(released_config(eos), indent=1))
    print(f"step: {len(ids)} positions, greedy {len(generated)} tokens, logit range "
          f"{logits.min():.2f}..{logits.max():.2f}")


if __name__ == "__main__":
    main()
