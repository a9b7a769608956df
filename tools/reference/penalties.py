#!/usr/bin/env python3
"""Reference answers with penalties, for engine/tests/penalties.rs.

`repetition_penalty` is transformers' own (RepetitionPenaltyLogitsProcessor:
over the prompt and the answer, a token's positive logit divided by the
penalty and a negative one multiplied). OpenAI's `frequency_penalty` and
`presence_penalty` are not in transformers; they are applied here as the
OpenAI API defines them and vLLM computes them: over the answer so far,
logit -= frequency * count + presence * (count > 0), after the repetition
penalty. Greedy, so the tokens alone are the reference; an answer ends at the
model's end-of-sequence token (kept last, as transformers keeps it).

    /opt/ref/bin/python tools/reference/penalties.py engine/tests/fixtures/qwen3_moe_released
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

TOKENS = 48
CASES = [
    {"repetition_penalty": 1.3, "frequency_penalty": 0.0, "presence_penalty": 0.0},
    {"repetition_penalty": 0.8, "frequency_penalty": 0.0, "presence_penalty": 0.0},
    {"repetition_penalty": 1.0, "frequency_penalty": 0.7, "presence_penalty": 0.0},
    {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 1.5},
    {"repetition_penalty": 1.2, "frequency_penalty": 0.4, "presence_penalty": 0.6},
]


class OpenAiPenalties(LogitsProcessor):
    """frequency and presence penalties over the answer (not the prompt)."""

    def __init__(self, prompt_len, frequency, presence):
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids, scores):
        answer = input_ids[:, self.prompt_len:]
        counts = torch.zeros_like(scores)
        counts.scatter_add_(1, answer, torch.ones_like(answer, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def main():
    folder = Path(sys.argv[1])
    expected = json.loads((folder / "expected.json").read_text())
    prompt = expected["prompt_ids"]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = {"transformers_version": transformers.__version__, "prompt_ids": prompt, "cases": []}
    for case in CASES:
        extra = LogitsProcessorList([OpenAiPenalties(len(prompt), case["frequency_penalty"], case["presence_penalty"])])
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=TOKENS,
                do_sample=False,
                repetition_penalty=case["repetition_penalty"],
                logits_processor=extra,
                pad_token_id=0,
            )[0, len(prompt):].tolist()
        out["cases"].append({**case, "tokens": tokens})
        print(case, tokens[:12], "…")
    plain = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           max_new_tokens=TOKENS, do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
    out["plain_tokens"] = plain
    (folder / "penalties.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
