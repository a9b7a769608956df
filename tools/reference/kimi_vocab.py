#!/usr/bin/env python3
"""A Kimi-style tiktoken vocabulary for Longhaul's fixtures, and the
reference encoder to check Longhaul's against.

Moonshot publishes Kimi's tokenizer as `tiktoken.model` (a base64 token and
its rank per line) plus `tokenization_kimi.py`, whose `TikTokenTokenizer`
adds the split pattern and 256 special ids after the base ranks, named by
`tokenizer_config.json`'s `added_tokens_decoder`. This module builds a small
vocabulary in that layout (a byte-level BPE trained on a mixed corpus, its
merges written as tiktoken ranks) and encodes text the way
`TikTokenTokenizer.encode` does: the `tiktoken` package with Kimi's pattern,
after cutting the text into 400,000-character pieces and again where a run
of whitespace or non-whitespace passes 25,000 characters.

Reference tooling only (tiktoken and tokenizers from PyPI); never run in CI.

    python3 tools/reference/kimi_vocab.py engine/tests/fixtures/kimi_tiktoken
"""

import base64
import json
import sys
from pathlib import Path

import tiktoken
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

# `TikTokenTokenizer.pat_str`, joined as the Python file joins it.
KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
RESERVED = 256
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000
# Base ranks: the 256 bytes and this many merges.
MERGES = 512

# Kimi K2's named specials, by offset from the first special id, and
# whether each is `special` (skipped when decoding).
K2_SPECIALS = {
    0: ("[BOS]", True),
    1: ("[EOS]", True),
    2: ("<|im_end|>", True),
    3: ("<|im_user|>", True),
    4: ("<|im_assistant|>", True),
    6: ("<|start_header_id|>", True),
    7: ("<|end_header_id|>", True),
    9: ("[EOT]", True),
    10: ("<|im_system|>", True),
    11: ("<|tool_calls_section_begin|>", False),
    12: ("<|tool_calls_section_end|>", False),
    13: ("<|tool_call_begin|>", False),
    14: ("<|tool_call_argument_begin|>", False),
    15: ("<|tool_call_end|>", False),
    17: ("<|im_middle|>", True),
    254: ("[UNK]", True),
    255: ("[PAD]", True),
}

CORPUS = """
Longhaul runs large mixture-of-experts models on one computer, streaming expert weights from
several drives. The router picks a few experts for every token; only those are read. I'm sure
they'll read it, and we've checked: it's what the cache isn't holding that costs time.
def read_experts(layer, ids):
    for expert in ids:
        if expert not in cache:
            yield drives.read(layer, expert)
    return None
class Pilot:
    def predict(self, hidden_state):  # the next layer's router
        return self.router(hidden_state).topk(8)
长时间运行的模型在夜里完成审计任务，早上结果就在那里。专家权重从多个固态硬盘流式读取。
こんにちは、世界。カタカナとひらがなと漢字が混ざった文章です。夜の間に仕事が終わります。
안녕하세요 세계. 전문가 가중치를 읽습니다.
Numbers: 1234567890 3.14159 2026-12-01 0x7f 1e-4 100000 tokens per second.
Emoji: 🚀🔥👍🏽 👨‍👩‍👧 ✅ ❤️ 🙂
Whitespace:    four spaces, two\t\ttabs,
blank lines


and CRLF\r\nendings.
Runs: abcabcabcabc 111 222 333 444 555 666 777 888 999 000 xxxxxxxx
""" * 8


def bytes_to_unicode() -> dict:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_ranks() -> dict:
    """Byte-level BPE merges trained on the corpus, as tiktoken ranks: each
    byte first, then each merge's result in merge order."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=256 + MERGES,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    decoder = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes([b]): b for b in range(256)}
    merges = json.loads(tok.to_str())["model"]["merges"]
    for merge in merges:
        a, b = merge if isinstance(merge, list) else merge.split(" ")
        token = bytes(decoder[c] for c in a + b)
        if token not in ranks and len(ranks) < 256 + MERGES:
            ranks[token] = len(ranks)
    return ranks


def specials(base: int, reserved: int = RESERVED) -> dict:
    named = {base + k: name for k, (name, _) in K2_SPECIALS.items()}
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(base, base + reserved)}


def encoding(ranks: dict) -> tiktoken.Encoding:
    return tiktoken.Encoding(
        name="tiktoken.model",
        pat_str=KIMI_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=specials(len(ranks)),
    )


def split_runs(s: str, limit: int):
    """`TikTokenTokenizer._split_whitespaces_or_nonwhitespaces`."""
    current_len = 0
    current_space = s[0].isspace() if len(s) > 0 else False
    start = 0
    for i in range(len(s)):
        now = s[i].isspace()
        if current_space ^ now:
            current_len = 1
            current_space = now
        else:
            current_len += 1
            if current_len > limit:
                yield s[start:i]
                start = i
                current_len = 1
    yield s[start:]


def kimi_encode(enc: tiktoken.Encoding, text: str) -> list:
    """`TikTokenTokenizer.encode(text)`: every special allowed."""
    ids = []
    for i in range(0, len(text), MAX_ENCODE_CHARS):
        for piece in split_runs(text[i : i + MAX_ENCODE_CHARS], MAX_RUN_CHARS):
            ids.extend(enc.encode(piece, allowed_special="all"))
    return ids


# Long encodings are stored as their length, ends and FNV-1a digest.
LONG_IDS = 256
EDGE = 64


def fnv1a(ids: list) -> str:
    """64-bit FNV-1a over the ids as little-endian u32s, as hex."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def write_vocab(out: Path, ranks: dict) -> None:
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    (out / "tiktoken.model").write_text("\n".join(lines) + "\n")


def tokenizer_config(base: int) -> dict:
    added = {
        str(base + k): {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for k, (name, special) in sorted(K2_SPECIALS.items())
    }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": [
            "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
            "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>",
        ],
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    }


def corpus(base: int) -> list:
    """Texts the agreement test encodes: literal ones, and long generated
    ones as {"repeat": s, "times": n} (text = s * n)."""
    lit = [
        "Hello world",
        "The quick brown fox; I'm sure THEY'LL read it, we've checked it's fine.",
        "def f(x):\n    return x ** 2  # square\n\tif x:\n\t\tpass\n",
        "长时间运行的模型在夜里完成审计任务，早上结果就在那里。",
        "你好世界abc漢字かなカナ한국어",
        "こんにちは、世界。カタカナ",
        "Emoji 🚀🔥👍🏽 family 👨‍👩‍👧 flag 🇯🇵 heart ❤️",
        "Digits 1234567 12 123 1234 3.14159 2026-12-01 ٣٤٥ ½",
        "a  b   c\n\n\n  d\t\t e \r\n f\r\r",
        " " * 30 + "x",
        "   leading and trailing   ",
        "\n",
        "",
        "<|im_user|>user<|im_middle|>hi there<|im_end|><|im_assistant|>assistant<|im_middle|>",
        "text [EOS] more [BOS][PAD] and <|tool_call_begin|>functions.get:0<|tool_call_argument_begin|>{\"a\":1}<|tool_call_end|>",
        f"<|reserved_token_{base + 5}|> and <|im_endx|> and <|im_end",
        "separators \x1c\x1d\x1e\x1f and \u0085 \u00a0 \u2003 \u3000 ideographic",
        "Ünïcödé Ärger ÉCOLE naïve façade Ωμέγα Кириллица",
        "mixed汉字English混合Text123数字",
        "URL https://example.com/a/b?c=1&d=2#frag and e-mail a.b@c.de",
        "JSON {\"key\": [1, 2, 3], \"nested\": {\"x\": null}}",
    ]
    gen = [
        {"repeat": "a", "times": MAX_RUN_CHARS + 1},
        {"repeat": " ", "times": MAX_RUN_CHARS + 7},
        {"repeat": "ab ", "times": 9000},
        {"repeat": "x", "times": 2 * MAX_RUN_CHARS + 3},
        {"repeat": "\n", "times": MAX_RUN_CHARS + 2},
        {"repeat": "word ", "times": 90000},
        {"repeat": "汉字", "times": 13000},
        {"repeat": "abc", "times": 8334},
        {"repeat": "1", "times": MAX_RUN_CHARS + 2},
    ]
    return [{"text": t} for t in lit] + gen


# A chat template written in the shape of Kimi K2's (its macros, compact
# tool JSON, default system turn, role tokens and tool-call section).
CHAT_TEMPLATE = """{%- macro render_content(msg) -%}
    {%- set c = msg.get('content') -%}
    {%- if c is string -%}{{ c }}{%- elif c is not none -%}{% for part in c -%}{{ part['text'] }}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>{%- endif -%}
{%- if messages|length == 0 or messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>You are a careful assistant.<|im_end|>{%- endif -%}
{%- for message in messages -%}
  {%- set role_name = message.get('name') or message['role'] -%}
  {%- if message['role'] == 'user' -%}<|im_user|>{{ role_name }}<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}<|im_assistant|>{{ role_name }}<|im_middle|>
  {%- else -%}<|im_system|>{{ role_name }}<|im_middle|>{%- endif -%}
  {%- if message['role'] == 'tool' -%}## Return of {{ message.tool_call_id }}
{{ render_content(message) }}
  {%- else -%}{{ render_content(message) }}{%- endif -%}
  {%- if message.get('tool_calls') -%}<|tool_calls_section_begin|>
    {%- for tc in message['tool_calls'] -%}<|tool_call_begin|>{{ tc['id'] }}<|tool_call_argument_begin|>{% if tc['function']['arguments'] is string %}{{ tc['function']['arguments'] }}{% else %}{{ tc['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>
    {%- endfor -%}<|tool_calls_section_end|>
  {%- endif -%}
  <|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"""


class KimiTokenizer:
    """What make_fixtures asks of a tokenizer, over a Kimi-style tiktoken
    vocabulary, and the files a Kimi release ships for it."""

    def __init__(self):
        self.ranks = build_ranks()
        self.base = len(self.ranks)
        self.enc = encoding(self.ranks)
        self.names = {self.base + k: (name, special) for k, (name, special) in K2_SPECIALS.items()}

    def encode(self, text: str):
        class Encoded:
            pass

        e = Encoded()
        e.ids = kimi_encode(self.enc, text)
        return e

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            # Special ids marked special (and the unnamed reserved ones) are left out.
            ids = [i for i in ids if i < self.base or not self.names.get(i, ("", True))[1]]
        return self.enc.decode(ids)

    def token_to_id(self, token: str):
        return self.enc._special_tokens.get(token)

    def get_vocab_size(self) -> int:
        return self.base + RESERVED

    def write(self, out: Path) -> None:
        write_vocab(out, self.ranks)
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(self.base), indent=2))
        (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "engine/tests/fixtures/kimi_tiktoken")
    out.mkdir(parents=True, exist_ok=True)
    ranks = build_ranks()
    write_vocab(out, ranks)
    base = len(ranks)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(base), indent=2))
    enc = encoding(ranks)
    cases = []
    for case in corpus(base):
        text = case.get("text")
        if text is None:
            text = case["repeat"] * case["times"]
        ids = kimi_encode(enc, text)
        assert enc.decode(ids) == text
        if len(ids) <= LONG_IDS:
            cases.append(dict(case, ids=ids))
        else:
            cases.append(dict(case, count=len(ids), head=ids[:EDGE], tail=ids[-EDGE:], fnv1a=fnv1a(ids)))
    # Decoding pieces that end inside a character: tiktoken replaces them.
    emoji = kimi_encode(enc, "🚀🔥👍🏽 漢字")
    decodes = [{"ids": emoji[:k], "text": enc.decode(emoji[:k])} for k in range(1, len(emoji) + 1)]
    expected = {
        "tiktoken_version": tiktoken.__version__,
        "base_ranks": base,
        "cases": cases,
        "decodes": decodes,
    }
    (out / "expected_tokens.json").write_text(json.dumps(expected))
    total = sum(c.get("count", len(c.get("ids", []))) for c in cases)
    print(f"{len(ranks)} base ranks, {len(cases)} texts, {total} ids")


if __name__ == "__main__":
    main()
