"""gpt-oss as OpenAI publishes it, in small: harmony's special tokens after
the base ranks (o200k_harmony's order, reserved slots named as its
converter names them), the release's own chat template, its generation
config (`<|return|>`, `<|endoftext|>` and `<|call|>` end a turn), and a
scripted model that answers in harmony's two channels.

The scripted model is a real gpt-oss checkpoint whose weights are set, not
drawn: attention and experts of every layer but one add nothing, so the
hidden state is the current token's embedding, and the LM head maps each
token of a fixed answer to the next one. Harmony writes `<|channel|>` and
`<|message|>` twice (analysis, then final), so the next token there depends
on what came before: layer 1 attends to every position equally (no query),
and its value reads a marker only the reasoning's first token carries; once
that token is in the context, the head's choice after `<|channel|>` turns
from `analysis` to `final` and after `<|message|>` from the reasoning to the
answer. transformers' own greedy generation is the reference for the tokens.
"""

import json
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

# Ids after the base ranks, as o200k_harmony has them from 199998.
SPECIALS = {
    "<|startoftext|>": 0,
    "<|endoftext|>": 1,
    "<|return|>": 4,
    "<|constrain|>": 5,
    "<|channel|>": 7,
    "<|start|>": 8,
    "<|end|>": 9,
    "<|message|>": 10,
    "<|call|>": 14,
    "<|endofprompt|>": 20,
}
SPECIAL_SLOTS = 21
# The base vocabulary; the config's vocab_size pads past the specials as the
# release's does (201088 for 200019 tokens).
BASE = 480
VOCAB = 512
# The answer the scripted model gives, as text: one token per word.
REASONING = " quick fox"
ANSWER = " lazy dog"

# Hidden dimensions the script reserves: the marker the first reasoning token
# carries, the count layer 1 writes, and a constant the head's threshold reads.
MARK, SEEN, ONE = 0, 1, 2
# Head weight of a token's successor; of the seen/not-seen choice; the count
# (after the final norm's scale) above which the reasoning counts as seen.
NEXT_WEIGHT = 40.0
CHOICE_WEIGHT = 2.0
SEEN_THRESHOLD = 0.1
# Layer 1's value gain: a marker among ~200 positions reads as ~1.
SEEN_GAIN = 40.0


def special_names() -> list:
    names = {v: k for k, v in SPECIALS.items()}
    return [names.get(k, f"<|reserved_{199998 + k}|>") for k in range(SPECIAL_SLOTS)]


def corpus(base_corpus: str, template_text: str) -> list:
    # Harmony's headers write these words right after a special token; the
    # scripted answer's words are single tokens.
    headers = "".join(f"\n{w}" for w in ("assistant", "analysis", "final", "commentary", "developer", "system", "user"))
    return [base_corpus, template_text, (headers + REASONING + ANSWER) * 200]


def build_tokenizer(base_corpus: str, template_text: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE, special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus(base_corpus, template_text), trainer)
    assert tok.get_vocab_size() == BASE, tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(n, normalized=False, special=True) for n in special_names()])
    for name, k in SPECIALS.items():
        assert tok.token_to_id(name) == BASE + k, name
    return tok


def write(tok: Tokenizer, out: Path, template: str) -> None:
    """The tokenizer files as gpt-oss-20b ships them."""
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(BASE + k): {"content": n, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True}
        for k, n in enumerate(special_names())
    }
    config = {
        "added_tokens_decoder": added,
        "bos_token": "<|startoftext|>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|return|>",
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(template)
    ids = {n: BASE + k for n, k in SPECIALS.items()}
    generation = {
        "bos_token_id": ids["<|startoftext|>"],
        "do_sample": True,
        "eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "transformers_version": "4.55.0.dev0",
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def one(tok: Tokenizer, text: str) -> int:
    ids = tok.encode(text).ids
    assert len(ids) == 1, (text, ids)
    return ids[0]


def answer_ids(tok: Tokenizer) -> tuple:
    """The scripted answer after the prompt's `<|start|>assistant`."""
    s = lambda n: BASE + SPECIALS[n]  # noqa: E731
    reasoning = tok.encode(REASONING).ids
    answer = tok.encode(ANSWER).ids
    head = [s("<|channel|>"), one(tok, "analysis"), s("<|message|>")]
    middle = [s("<|end|>"), s("<|start|>"), one(tok, "assistant"), s("<|channel|>"), one(tok, "final"), s("<|message|>")]
    chain = head + reasoning + middle + answer + [s("<|return|>")]
    return chain, reasoning, answer


@torch.no_grad()
def script(model, tok: Tokenizer, gen: torch.Generator) -> None:
    """Sets `model`'s weights so that greedy decoding after a harmony
    prompt writes the chain of `answer_ids`."""
    chain, reasoning, answer = answer_ids(tok)
    s = lambda n: BASE + SPECIALS[n]  # noqa: E731
    assistant = one(tok, "assistant")
    # Successors that do not depend on the context; the two that do.
    successor = {}
    for cur, nxt in zip([assistant] + chain, chain):
        if cur not in (s("<|channel|>"), s("<|message|>")):
            assert successor.get(cur, nxt) == nxt, f"token {cur} would need two successors"
            successor[cur] = nxt
    choice = {
        s("<|channel|>"): (one(tok, "analysis"), one(tok, "final")),
        s("<|message|>"): (reasoning[0], answer[0]),
    }
    assert len(set(chain) - {s("<|channel|>"), s("<|message|>")}) == len(chain) - 4, "chain tokens repeat"

    for p in model.parameters():
        p.zero_()
    hidden = model.config.hidden_size
    free = hidden - 3
    # Embeddings: a random direction in the free dimensions, the chain's own
    # orthonormal so that a token's successor is the only one it points at.
    emb = model.model.embed_tokens.weight
    emb[:, 3:] = torch.randn(emb.shape[0], free, generator=gen)
    tokens = sorted(set(chain) | {assistant})
    assert len(tokens) <= free
    q, _ = torch.linalg.qr(torch.randn(free, len(tokens), generator=gen))
    for j, t in enumerate(tokens):
        emb[t, 3:] = q[:, j]
    emb[:, 3:] /= emb[:, 3:].norm(dim=1, keepdim=True)
    emb[:, ONE] = 1.0
    emb[reasoning[0], MARK] = 1.0

    for layer in model.model.layers:
        layer.input_layernorm.weight.fill_(1.0)
        layer.post_attention_layernorm.weight.fill_(1.0)
        layer.mlp.router.weight.copy_(torch.randn(layer.mlp.router.weight.shape, generator=gen))
    model.model.norm.weight.fill_(1.0)
    # Layer 1 (full attention): no query, so every position weighs the same;
    # kv head 0's first value channel reads the marker, query head 0 writes
    # it to SEEN.
    attn = model.model.layers[1].self_attn
    assert model.config.layer_types[1] == "full_attention"
    attn.v_proj.weight[0, MARK] = 1.0
    attn.o_proj.weight[SEEN, 0] = SEEN_GAIN

    head = model.lm_head.weight
    free_part = lambda t: torch.cat([torch.zeros(3), emb[t, 3:]])  # noqa: E731
    for cur, nxt in successor.items():
        head[nxt] += NEXT_WEIGHT * free_part(cur)
    unit = lambda d: torch.nn.functional.one_hot(torch.tensor(d), hidden).float()  # noqa: E731
    seen = unit(SEEN) - SEEN_THRESHOLD * unit(ONE)
    for cur, (before, after) in choice.items():
        head[before] += NEXT_WEIGHT * free_part(cur) - CHOICE_WEIGHT * seen
        head[after] += NEXT_WEIGHT * free_part(cur) + CHOICE_WEIGHT * seen
