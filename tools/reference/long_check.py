#!/usr/bin/env python3
"""Error over long sequences for the hybrid (linear-attention) families.

Feeds 2,048 seeded random token ids to transformers (one pass: its chunked
linear-attention form) and step by step with a cache (its recurrent form),
and to Longhaul (`longhaul logits`, the recurrent form in one pass), then
prints the largest |Δlogit| per band of positions. Not run in CI; the
figures go into the notes.

    ~/.cache/longhaul/refvenv/bin/python tools/reference/long_check.py \\
        BIN engine/tests/fixtures/kimi_linear_released [...]
"""

import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

LENGTH = 2048
BANDS = [(0, 256), (256, 512), (512, 1024), (1024, 2048)]


@torch.no_grad()
def check(binary: str, folder: str) -> dict:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(2048)
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (LENGTH,), generator=gen).tolist()
    chunked = model(torch.tensor([ids])).logits[0]
    cache = DynamicCache(config=model.config)
    rows = []
    for t in ids:
        out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        rows.append(out.logits[0, -1])
    recurrent = torch.stack(rows)
    run = subprocess.run(
        [binary, "logits", "--model", folder, "--ids", ",".join(map(str, ids)), "--json"],
        capture_output=True, text=True, check=True,
    )
    ours = torch.tensor(json.loads(run.stdout)["logits"])

    def bands(a, b):
        d = (a - b).abs().max(-1).values
        return {f"{lo}-{hi}": float(d[lo:hi].max()) for lo, hi in BANDS}

    return {
        "model": folder.rstrip("/").split("/")[-1],
        "logit_scale": float(chunked.abs().max()),
        "longhaul_vs_chunked": bands(ours, chunked),
        "longhaul_vs_recurrent": bands(ours, recurrent),
        "chunked_vs_recurrent": bands(chunked, recurrent),
    }


def main() -> None:
    torch.set_num_threads(1)
    binary = sys.argv[1]
    for folder in sys.argv[2:]:
        print(json.dumps(check(binary, folder)))


if __name__ == "__main__":
    main()
