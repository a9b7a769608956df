"""Random GGML blocks and what the `gguf` package's numpy dequantiser makes of
them: the reference Longhaul's block decoders are checked against.

Usage: python make_ggml_blocks.py OUT_DIR   (needs `pip install gguf numpy`)

Each OUT_DIR/<TYPE>.bin holds: u32 byte count, the blocks' bytes, then the
dequantised values as little-endian f32. Block bytes are random except the
f16 scales, which are drawn from a normal distribution so they are finite.
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# type: (blocks, offsets of f16 fields in a block, block bytes)
TYPES = {
    T.Q4_0: (8, [0], 18),
    T.Q4_1: (8, [0, 2], 20),
    T.Q5_0: (8, [0], 22),
    T.Q5_1: (8, [0, 2], 24),
    T.Q8_0: (8, [0], 34),
    T.Q2_K: (2, [80, 82], 84),
    T.Q3_K: (2, [108], 110),
    T.Q4_K: (2, [0, 2], 144),
    T.Q5_K: (2, [0, 2], 176),
    T.Q6_K: (2, [208], 210),
    T.IQ4_NL: (8, [0], 18),
    T.IQ4_XS: (2, [0], 136),
    T.MXFP4: (8, [], 17),
    T.IQ2_XXS: (2, [0], 66),
    T.IQ2_XS: (2, [0], 74),
    T.IQ2_S: (2, [0], 82),
    T.IQ3_XXS: (2, [0], 98),
    T.IQ3_S: (2, [0], 110),
    T.IQ1_S: (2, [0], 50),
    T.IQ1_M: (2, [], 56),
}
# IQ1_M spreads its f16 scale over the top nibbles of the bytes at these
# offsets: kept at 3 so the scale is a modest normal number.
IQ1_M_SCALE_BYTES = (49, 51, 53, 55)
# MXFP4's first byte is an E8M0 scale: kept near 2^0 so values stay normal.
E8M0_RANGE = (110, 145)


def main(out: Path) -> None:
    rng = np.random.default_rng(20261130)
    out.mkdir(parents=True, exist_ok=True)
    for qtype, (blocks, halves, size) in TYPES.items():
        raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
        for at in halves:
            scale = rng.normal(0.0, 0.05, size=blocks).astype(np.float16)
            raw[:, at:at + 2] = scale.view(np.uint8).reshape(blocks, 2)
        if qtype == T.MXFP4:
            raw[:, 0] = rng.integers(*E8M0_RANGE, size=blocks)
        if qtype == T.IQ1_M:
            for at in IQ1_M_SCALE_BYTES:
                raw[:, at] = (raw[:, at] & 0x0F) | 0x30
        values = dequantize(raw.reshape(-1), qtype).astype(np.float32)
        body = raw.tobytes()
        (out / f"{qtype.name}.bin").write_bytes(
            struct.pack("<I", len(body)) + body + values.astype("<f4").tobytes())
        print(qtype.name, values.size, "values")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
