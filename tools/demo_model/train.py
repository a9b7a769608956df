#!/usr/bin/env python3
"""Trains Longhaul's demo models: a small Qwen3-MoE and a draft on the same tokenizer.

Why: a new user has no trillion-parameter model on four SSDs yet, but `longhaul
demo` should still stream a real mixture-of-experts model from several drives
and answer in readable language. A model with random weights would exercise the
code but route uniformly and print noise; a trained one has the routing skew,
cache behaviour and text of a real model, only smaller.

What: the Python documentation (see corpus.py; PSF License Version 2) as plain
prose and as chat exchanges, a byte-level BPE tokenizer trained on it, and two
models trained with transformers' own Qwen3-MoE code, so the checkpoints are
exactly what the reference implementation computes:

- `longhaul-demo-moe`: 6 layers, hidden 256, 32 routed experts per layer, 4 per
  token, about 17.5 M parameters.
- `longhaul-demo-draft`: 2 layers, hidden 128, 8 experts, 2 per token, about
  1.6 M parameters: a fast guesser for speculative decoding.
- `longhaul-demo-draft-2k`: the same draft on its own tokenizer (a 2,048-token
  BPE, so its token boundaries differ from the demo model's): the guesser of
  speculative decoding across tokenizers, whose guesses travel as text.

Both are stored in BF16 in the Hugging Face layout of released Qwen3-MoE
checkpoints (one tensor per expert projection), with `tokenizer.json`, a
ChatML chat template and a generation config. The script also writes
`reference.json` (transformers' logits for a validation passage and its greedy
answer to the demo prompt, for Longhaul's numerics test) and
`training-report.json` (validation perplexity, timings, samples).

Training runs a fixed number of steps with fixed seeds, so a rerun makes the
same model on the same machine; on 2 CPU cores it takes about an hour. Run by
hand (not in CI; torch from PyPI is large):

    python3 -m venv ~/.cache/longhaul/refvenv
    ~/.cache/longhaul/refvenv/bin/pip install -r tools/demo_model/requirements.txt
    ~/.cache/longhaul/refvenv/bin/python tools/demo_model/train.py assets
"""

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

VOCAB = 4096
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Share of sections written as a chat exchange; the rest are plain prose.
CHAT_SHARE = 0.6
# Share of sections (whole, by title) held out for validation.
VALIDATION_SHARE = 0.03
SEQ_LEN = 512
BATCH = 8
EVAL_EVERY = 250
EVAL_TOKENS = 65536
WARMUP_STEPS = 100
MIN_LR_FRACTION = 0.1
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
SEED = 20261129
THREADS = 2
# The prompt `longhaul demo` submits; its greedy answer goes into reference.json.
DEMO_PROMPT = "Explain how to read and write files."
SAMPLE_CHATS = [
    DEMO_PROMPT,
    "What is a generator?",
    "How do I sort a list of dictionaries by a key?",
    "Explain the global interpreter lock.",
]
SAMPLE_TEXTS = ["A context manager is", "The dictionary type"]
SAMPLE_TOKENS = 120
# Held-out text shipped with the model, for scoring it (`longhaul compare --text`).
VALIDATION_SAMPLE_CHARS = 4000

MODELS = {
    "longhaul-demo-moe": dict(
        hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        moe_intermediate_size=96, num_experts=32, num_experts_per_tok=4, intermediate_size=1024,
        steps=2200, lr=2e-3,
    ),
    "longhaul-demo-draft": dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, intermediate_size=512,
        steps=1500, lr=3e-3,
    ),
    "longhaul-demo-draft-2k": dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, intermediate_size=512,
        steps=1500, lr=3e-3, vocab=2048,
    ),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_examples(sections: list) -> tuple:
    """Splits sections into train/validation by title and renders each as text."""
    rng = random.Random(SEED)
    train, val = [], []
    for s in sections:
        held_out = random.Random(f"{s.source}#{s.title}").random() < VALIDATION_SHARE
        if rng.random() < CHAT_SHARE:
            text = (f"<|im_start|>user\n{corpus.request_for(s.title)}<|im_end|>\n"
                    f"<|im_start|>assistant\n{s.paragraphs}<|im_end|>\n")
        else:
            text = f"{s.title}\n\n{s.paragraphs}\n"
        (val if held_out else train).append(text + "<|endoftext|>")
    return train, val


def build_tokenizer(texts: list, vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def token_stream(tok: Tokenizer, texts: list) -> torch.Tensor:
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


def model_config(tok: Tokenizer, spec: dict) -> Qwen3MoeConfig:
    shape = {k: v for k, v in spec.items() if k not in ("steps", "lr", "vocab")}
    cfg = Qwen3MoeConfig(
        vocab_size=tok.get_vocab_size(), max_position_embeddings=SEQ_LEN * 2, rms_norm_eps=1e-6, hidden_act="silu",
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        output_router_logits=True, router_aux_loss_coef=0.01,
        bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<|endoftext|>"),
        **shape,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def released_config(cfg: Qwen3MoeConfig) -> dict:
    """config.json as released Qwen3-MoE checkpoints spell it."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_experts": cfg.num_local_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "norm_topk_prob": cfg.norm_topk_prob,
        "decoder_sparse_step": cfg.decoder_sparse_step,
        "mlp_only_layers": [],
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu",
        "rope_theta": cfg.rope_parameters["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": cfg.router_aux_loss_coef,
        "bos_token_id": None,
        "eos_token_id": cfg.eos_token_id,
        "torch_dtype": "bfloat16",
    }


@torch.no_grad()
def evaluate(model, val: torch.Tensor) -> float:
    """Mean next-token loss over non-overlapping validation windows."""
    model.eval()
    total, count = 0.0, 0
    limit = min(len(val) - 1, EVAL_TOKENS)
    for start in range(0, limit - SEQ_LEN, SEQ_LEN):
        x = val[start : start + SEQ_LEN + 1].unsqueeze(0)
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum")
        total += loss.item()
        count += SEQ_LEN
    model.train()
    return total / count


def train(name: str, spec: dict, tok: Tokenizer, train_ids: torch.Tensor, val_ids: torch.Tensor) -> tuple:
    torch.manual_seed(SEED)
    cfg = model_config(tok, spec)
    model = Qwen3MoeForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    log(f"{name}: {params / 1e6:.2f} M parameters, {spec['steps']} steps of {BATCH}x{SEQ_LEN} tokens")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec["lr"], betas=(0.9, 0.95),
    )
    steps = spec["steps"]

    def lr_at(step: int) -> float:
        if step < WARMUP_STEPS:
            return spec["lr"] * (step + 1) / WARMUP_STEPS
        progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
        return spec["lr"] * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(SEED)
    best = (float("inf"), None, 0)
    history = []
    started = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, len(train_ids) - SEQ_LEN - 1, (BATCH,), generator=gen)
        x = torch.stack([train_ids[s : s + SEQ_LEN + 1] for s in starts.tolist()])
        out = model(input_ids=x[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        total = loss + cfg.router_aux_loss_coef * out.aux_loss if out.aux_loss is not None else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        if step % 25 == 0:
            elapsed = time.time() - started
            eta = elapsed / (step + 1) * (steps - step - 1)
            log(f"{name} step {step}/{steps} loss {loss.item():.3f} lr {lr_at(step):.2e} "
                f"{(step + 1) * BATCH * SEQ_LEN / elapsed:.0f} tok/s, eta {eta / 60:.1f} min")
        if (step + 1) % EVAL_EVERY == 0 or step + 1 == steps:
            val = evaluate(model, val_ids)
            history.append({"step": step + 1, "train_loss": loss.item(), "val_loss": val})
            log(f"{name} step {step + 1}: validation loss {val:.3f} (perplexity {math.exp(val):.2f})")
            if val < best[0]:
                best = (val, {k: v.detach().clone() for k, v in model.state_dict().items()}, step + 1)
    model.load_state_dict(best[1])
    model.eval()
    return model, cfg, {
        "parameters": params, "steps": steps, "best_step": best[2], "batch": BATCH, "seq_len": SEQ_LEN,
        "tokens_seen": steps * BATCH * SEQ_LEN, "train_seconds": round(time.time() - started, 1),
        "history": history,
    }


def per_expert(state: dict) -> dict:
    """Released layout: one tensor per expert projection (transformers fuses them in memory)."""
    out = {}
    for k, v in state.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            prefix = k[: -len("gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = v[e, :inter]
                out[f"{prefix}{e}.up_proj.weight"] = v[e, inter:]
        elif k.endswith("mlp.experts.down_proj"):
            prefix = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = v[e]
        else:
            out[k] = v
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


def write_checkpoint(model, cfg, tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(per_expert(model.state_dict()), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(released_config(cfg), indent=1) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": cfg.max_position_embeddings,
    }, indent=1) + "\n")
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    (out / "generation_config.json").write_text(json.dumps({
        "eos_token_id": eos, "pad_token_id": tok.token_to_id("<|endoftext|>"),
        "do_sample": True, "temperature": 0.7, "top_p": 0.9,
    }, indent=1) + "\n")


def write_validation_sample(folder: Path, val_texts: list) -> None:
    """Plain-prose validation examples, whole, up to VALIDATION_SAMPLE_CHARS."""
    out, size = [], 0
    for text in val_texts:
        if text.startswith("<|im_start|>"):
            continue
        text = text.replace("<|endoftext|>", "").strip()
        if size + len(text) > VALIDATION_SAMPLE_CHARS:
            continue
        out.append(text)
        size += len(text)
    (folder / "validation-sample.txt").write_text("\n\n".join(out) + "\n")


def chat_ids(tok: Tokenizer, prompt: str) -> list:
    return tok.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n").ids


@torch.no_grad()
def generate(model, tok: Tokenizer, ids: list, sample: bool) -> str:
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    torch.manual_seed(SEED)
    out = model.generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=SAMPLE_TOKENS, do_sample=sample, temperature=0.7 if sample else None,
        top_p=0.9 if sample else None, top_k=None, eos_token_id=eos, pad_token_id=eos[1],
    )[0, len(ids):].tolist()
    return tok.decode(out, skip_special_tokens=True)


@torch.no_grad()
def finish(name: str, folder: Path, tok: Tokenizer, val_ids: torch.Tensor, report: dict, val_text: str) -> dict:
    """Reloads the written checkpoint as a user would and measures it."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    val_loss = evaluate(model, val_ids)
    val_bytes = len(val_text.encode("utf-8"))
    val_tokens = min(len(val_ids) - 1, EVAL_TOKENS) // SEQ_LEN * SEQ_LEN
    report.update({
        "validation_loss": val_loss,
        "validation_perplexity": math.exp(val_loss),
        "validation_tokens": val_tokens,
        "bits_per_byte": val_loss / math.log(2) * len(val_ids) / val_bytes,
        "samples": {
            "chat_greedy": {p: generate(model, tok, chat_ids(tok, p), False) for p in SAMPLE_CHATS},
            "chat_sampled": {p: generate(model, tok, chat_ids(tok, p), True) for p in SAMPLE_CHATS},
            "text_sampled": {p: generate(model, tok, tok.encode(p).ids, True) for p in SAMPLE_TEXTS},
        },
    })
    log(f"{name}: validation perplexity {report['validation_perplexity']:.2f} (BF16, reloaded)")
    if name == "longhaul-demo-moe":
        teacher = val_ids[:64].tolist()
        logits = model(torch.tensor([teacher])).logits[0]
        prompt = chat_ids(tok, DEMO_PROMPT)
        eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
        greedy = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=48, do_sample=False, eos_token_id=eos, pad_token_id=eos[1],
        )[0, len(prompt):].tolist()
        (folder / "reference.json").write_text(json.dumps({
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "ids": teacher, "logits": [[round(float(x), 5) for x in row] for row in logits[:16]],
            "prompt": DEMO_PROMPT, "prompt_ids": prompt, "greedy_tokens": greedy,
            "greedy_text": tok.decode(greedy, skip_special_tokens=True),
        }) + "\n")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder that receives longhaul-demo-moe/ and longhaul-demo-draft/")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache/longhaul/demo-train",
                    help="where the Debian package is downloaded and unpacked")
    ap.add_argument("--only", choices=sorted(MODELS), help="train one model (its tokenizer is always rebuilt)")
    ap.add_argument("--steps", type=int, help="train this many steps instead (a quick trial of the whole script)")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    args.work.mkdir(parents=True, exist_ok=True)
    sections = corpus.load_sections(args.work)
    train_texts, val_texts = build_examples(sections)
    log(f"corpus: {len(sections)} sections, {sum(map(len, train_texts)) / 1e6:.2f} M characters for training, "
        f"{sum(map(len, val_texts)) / 1e6:.2f} M for validation")
    tokenized = {}
    for name, spec in MODELS.items():
        if args.only and name != args.only:
            continue
        vocab = spec.get("vocab", VOCAB)
        if vocab not in tokenized:
            tok = build_tokenizer(train_texts, vocab)
            tokenized[vocab] = (tok, token_stream(tok, train_texts), token_stream(tok, val_texts))
            log(f"tokenizer: {tok.get_vocab_size()} tokens; {len(tokenized[vocab][1])} training and "
                f"{len(tokenized[vocab][2])} validation tokens")
        tok, train_ids, val_ids = tokenized[vocab]
        if args.steps:
            spec = dict(spec, steps=args.steps)
        model, cfg, report = train(name, spec, tok, train_ids, val_ids)
        folder = args.out / name
        write_checkpoint(model, cfg, tok, folder)
        report.update({
            "corpus": {"package": corpus.DEB_PACKAGE, "license": "PSF-2.0", "sections": len(sections),
                       "train_tokens": len(train_ids), "validation_tokens": len(val_ids)},
            "config": released_config(cfg),
        })
        report = finish(name, folder, tok, val_ids, report, "".join(val_texts))
        write_validation_sample(folder, val_texts)
        (folder / "training-report.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
