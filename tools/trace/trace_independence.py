"""Whether a pack's routing repeats itself: read the trace summary in its heat
file (PACK/longhaul-heat.json) and compare a fixed expert set chosen on the
first half of the decode passes with the cache's share of the experts, and the
overlap of tokens d apart with random routing's top_k / experts.

When the first is close to the capacity share and the overlaps to random
routing's, routing is independent from token to token: no eviction policy can
hit much more often than the share of the experts the budget holds, and the
best fixed set and Belady replays reflect hindsight on noise.

Usage: python trace_independence.py PACK/longhaul-heat.json EXPERTS_IN_BUDGET
Needs: zstandard.
"""
import base64
import collections
import json
import struct
import sys

import zstandard


def load(path):
    """The heat file and its trace: (layer, [(expert, rows)]) per lookup."""
    heat = json.load(open(path))
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(base64.b64decode(heat["trace"]))
    vals = struct.unpack("<%dH" % (len(raw) // 2), raw)
    i, out = 0, []
    while i < len(vals):
        layer, n = vals[i], vals[i + 1]
        i += 2
        out.append((layer, [(vals[i + 2 * j], vals[i + 2 * j + 1]) for j in range(n)]))
        i += 2 * n
    return heat, out


def passes(trace):
    """Lookups grouped into passes: a pass begins at a layer no deeper than the last."""
    out, prev = [], None
    for layer, experts in trace:
        if prev is None or layer <= prev:
            out.append([])
        out[-1].append((layer, experts))
        prev = layer
    return out


def counts(ps):
    c = collections.Counter()
    for p in ps:
        for layer, experts in p:
            for e, _ in experts:
                c[(layer, e)] += 1
    return c


def main():
    _, trace = load(sys.argv[1])
    capacity = int(sys.argv[2])
    ps = passes(trace)
    # Decode passes: one row per expert lookup, every layer.
    depth = max(len(p) for p in ps)
    dec = [p for p in ps if len(p) == depth and all(r == 1 for _, e in p for _, r in e)]
    experts = len({(layer, e) for p in ps for layer, ex in p for e, _ in ex})
    first, second = counts(dec[: len(dec) // 2]), counts(dec[len(dec) // 2 :])
    chosen = {k for k, _ in first.most_common(capacity)}
    total = sum(second.values())
    print(f"decode passes {len(dec)}, experts seen {experts}")
    print(f"fixed set from the first half, hit on the second: {sum(v for k, v in second.items() if k in chosen) / total:.3f}")
    print(f"capacity share: {capacity / experts:.3f}")
    top_k = len(dec[0][0][1])
    for d in (1, 2, 3, 5, 8, 16):
        ov = [
            len({e for e, _ in a} & {e for e, _ in b}) / top_k
            for i in range(d, len(dec))
            for (_, a), (_, b) in zip(dec[i], dec[i - d])
        ]
        print(f"overlap of tokens {d} apart: {sum(ov) / len(ov):.3f}")


if __name__ == "__main__":
    main()
