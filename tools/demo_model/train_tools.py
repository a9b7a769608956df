#!/usr/bin/env python3
"""Trains Longhaul's tool demo: a small Qwen3-MoE that calls tools as Qwen3 does.

Why: agents send tools and expect calls back. The demo model writes prose and
cannot call a tool, so without this one the whole tool protocol (tools in the
template, calls read from the answer, results rendered back, a second turn)
could only be tested with hand-written answers. A model trained on tool-use
dialogues writes real calls, greedy and deterministic, on a fresh machine.

What: synthetic dialogues of a coding assistant with three tools (read_file,
list_files, search), rendered by a Qwen3-shaped chat template — tools in a
`<tools>` system block, calls as `<tool_call>{"name", "arguments"}</tool_call>`,
results as `<tool_response>` in a user turn — over the demo model's tokenizer
with Qwen3's four tool tags added as tokens. The model is trained with
transformers' own Qwen3-MoE code, stored in BF16 in the released layout, and
checked after training on held-out dialogues (report: tool accuracy).

Run by hand (not in CI), with the same venv as train.py:

    ~/.cache/longhaul/refvenv/bin/python tools/demo_model/train_tools.py assets
"""

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer
from transformers import AutoModelForCausalLM
from transformers.utils.chat_template_utils import render_jinja_template

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as base  # noqa: E402

NAME = "longhaul-demo-tools"
SPEC = dict(
    hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, intermediate_size=512,
    steps=1800, lr=3e-3,
)
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SEED = 20261202
DIALOGUES = 6000
HELD_OUT = 40
GREEDY_TOKENS = 64

# Qwen3's template, its tool parts as released (without thinking).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if (loop.first and message.content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def function(name: str, description: str, param: str, what: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {param: {"type": "string", "description": what}},
                       "required": [param]},
    }}


TOOLS = [
    function("read_file", "Reads a file of the project.", "path", "The file's path"),
    function("list_files", "Lists the files in a folder of the project.", "folder", "The folder"),
    function("search", "Finds the lines of the project that mention a word.", "pattern", "The word"),
]
WORDS = ("cache store pack drive queue engine router expert kernel token session prefix stats probe heat "
         "pilot budget layout manifest shard record stripe reader writer batch plan model config").split()
FOLDERS = "src engine service tools docs tests".split()
FACTS = [
    "keeps the hottest experts in memory", "reads expert records from the drives", "checks every record's checksum",
    "plans which experts to fetch next", "holds the jobs of the night", "counts the bytes read per drive",
    "writes the answer as it is made", "splits the weights over the drives", "times each layer of the model",
    "says how much memory is left",
]


def call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def dialogue(rng: random.Random) -> list:
    """One conversation: a question, a call, its result and the answer, or a plain exchange."""
    word, folder, fact = rng.choice(WORDS), rng.choice(FOLDERS), rng.choice(FACTS)
    path = f"{folder}/{word}.rs"
    kind = rng.randrange(4)
    if kind == 0:
        ask = rng.choice([f"What does {path} do?", f"Read {path}.", f"Open {path} and tell me what it does."])
        return [{"role": "user", "content": ask}, call("read_file", path=path),
                {"role": "tool", "content": f"// {path}: {fact}."},
                {"role": "assistant", "content": f"{path} {fact}."}]
    if kind == 1:
        names = sorted(rng.sample(WORDS, 3))
        listing = ", ".join(f"{n}.rs" for n in names)
        ask = rng.choice([f"Which files are in {folder}?", f"List the files in {folder}."])
        return [{"role": "user", "content": ask}, call("list_files", folder=folder),
                {"role": "tool", "content": listing},
                {"role": "assistant", "content": f"{folder} holds {listing}."}]
    if kind == 2:
        ask = rng.choice([f"Where is {word} mentioned?", f"Search the project for {word}."])
        return [{"role": "user", "content": ask}, call("search", pattern=word),
                {"role": "tool", "content": f"{path}:12: the {word}"},
                {"role": "assistant", "content": f"{word} is mentioned in {path}, line 12."}]
    a, b = rng.randrange(10), rng.randrange(10)
    return [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"{a + b}."}]


def render(messages: list, generation: bool = False) -> str:
    return render_jinja_template(conversations=[messages], tools=TOOLS, chat_template=CHAT_TEMPLATE,
                                 add_generation_prompt=generation)[0][0]


def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(Path(__file__).resolve().parents[2] / "assets/longhaul-demo-moe/tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    return tok


@torch.no_grad()
def accuracy(model, tok: Tokenizer, held_out: list) -> dict:
    """Greedy first turns of dialogues kept out of training (their questions
    may still occur in it): the call (or answer) written exactly."""
    right, samples = 0, []
    eos = [tok.token_to_id("<|im_end|>")]
    for messages in held_out:
        prompt = tok.encode(render(messages[:1], generation=True)).ids
        want = render(messages[:2])[len(render(messages[:1])):]
        want = want.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=GREEDY_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
        got = tok.decode(out[0, len(prompt):].tolist(), skip_special_tokens=True)
        right += got == want
        samples.append({"prompt": messages[0]["content"], "answer": got, "expected": want})
    return {"exact": right, "of": len(held_out), "samples": samples[:6]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder that receives longhaul-demo-tools/")
    ap.add_argument("--steps", type=int, help="train this many steps instead (a quick trial)")
    args = ap.parse_args()
    torch.set_num_threads(base.THREADS)
    rng = random.Random(SEED)
    dialogues = [dialogue(rng) for _ in range(DIALOGUES + HELD_OUT)]
    checked, dialogues = dialogues[:HELD_OUT], dialogues[HELD_OUT:]
    seen = {d[0]["content"] for d in dialogues}
    tok = tokenizer()
    texts = [render(d) + "<|endoftext|>" for d in dialogues]
    split = len(texts) * 97 // 100
    train_ids, val_ids = base.token_stream(tok, texts[:split]), base.token_stream(tok, texts[split:])
    spec = dict(SPEC, steps=args.steps or SPEC["steps"])
    base.log(f"{len(texts)} dialogues, {len(train_ids)} training tokens, vocabulary {tok.get_vocab_size()}")
    model, cfg, report = base.train(NAME, spec, tok, train_ids, val_ids)
    folder = args.out / NAME
    base.write_checkpoint(model, cfg, tok, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    generation = json.loads((folder / "generation_config.json").read_text())
    generation.update(do_sample=False)
    for k in ("temperature", "top_p"):
        generation.pop(k, None)
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n")
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    report.update({"config": base.released_config(cfg), "dialogues": len(dialogues), "tools": TOOLS,
                   "validation_loss": base.evaluate(reloaded, val_ids),
                   "first_turns": accuracy(reloaded, tok, checked),
                   "first_turns_unseen_in_training": sum(d[0]["content"] not in seen for d in checked)})
    base.log(f"first turns written exactly: {report['first_turns']['exact']}/{report['first_turns']['of']}")
    (folder / "training-report.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
