"""An agent session's prompts against an OpenAI-compatible server, timed.

Sends the turns an agent sends: a long first prompt (instructions and the
files it read), then each turn the whole conversation so far plus the call
it made and the tool's result, through the `openai` SDK's streaming
completions. Prints one JSON line per turn: prompt tokens (counted with the
model's tokenizer.json), seconds to the first streamed text, seconds in all.
The same script measures `longhaul serve` and llama-cpp-python's server, so
the turns are the same token for token.

Usage: python agent_session.py --base-url http://127.0.0.1:PORT/v1 --model NAME
         --tokenizer MODEL_DIR/tokenizer.json [--turns 5] [--first 12000] [--step 1000]
Needs: openai, tokenizers.
"""
import argparse
import json
import random
import time

import openai
from tokenizers import Tokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--api-key", default="none")
ap.add_argument("--turns", type=int, default=5)
ap.add_argument("--first", type=int, default=12000, help="tokens of the first prompt")
ap.add_argument("--step", type=int, default=1000, help="tokens each later turn adds")
ap.add_argument("--max-tokens", type=int, default=4)
ap.add_argument("--label", default="")
ap.add_argument("--only", default="", help="send only these turns (e.g. 2,5); the others are built, not sent")
a = ap.parse_args()

tok = Tokenizer.from_file(a.tokenizer)
rng = random.Random(0)
WORDS = ["cache", "drive", "expert", "layer", "token", "stream", "block", "read", "queue",
         "state", "prefix", "router", "weight", "kernel", "model", "batch", "answer", "tool"]


def text_of(tokens: int) -> str:
    """Words until the tokenizer counts `tokens`."""
    out, n = [], 0
    while n < tokens:
        line = " ".join(rng.choice(WORDS) for _ in range(12)) + ".\n"
        out.append(line)
        n += len(tok.encode(line).ids)
    return "".join(out)


prompt = "system: You audit the project below.\nuser: Read the files and report.\n" + text_of(a.first)
prompt += "assistant:"
client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, timeout=7200, max_retries=0)
for turn in range(1, a.turns + 1):
    if turn > 1:
        prompt += ' read_file("src/part%d.rs")\ntool: ' % turn + text_of(a.step) + "assistant:"
    n = len(tok.encode(prompt).ids)
    if a.only and str(turn) not in a.only.split(","):
        continue
    started = time.perf_counter()
    first = None
    stream = client.completions.create(model=a.model, prompt=prompt, max_tokens=a.max_tokens,
                                       temperature=0, stream=True)
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - started
    total = time.perf_counter() - started
    print(json.dumps({"label": a.label, "turn": turn, "prompt_tokens": n,
                      "ttft_s": round(first if first is not None else total, 2),
                      "total_s": round(total, 2)}), flush=True)
