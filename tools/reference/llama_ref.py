"""llama.cpp's side of the GGUF fixtures, through llama-cpp-python (which
builds llama.cpp from source; reference tooling, never in CI).

    python llama_ref.py quantize SRC.gguf DST.gguf FTYPE [pure]
    python llama_ref.py logits FILE.gguf IDS.json OUT.json
    python llama_ref.py tokenize FILE.gguf TEXTS.json OUT.json
    python llama_ref.py detokenize FILE.gguf IDS.json OUT.json

`logits` writes llama.cpp's logits for every position of the ids;
`tokenize` writes the ids llama.cpp gives each text, special tokens parsed
and no BOS added (how Longhaul encodes a rendered chat).
"""
import ctypes
import json
import sys

import llama_cpp


def quantize(src: str, dst: str, ftype: str, pure: bool) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    params.pure = pure
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize {ftype} failed: {rc}")


# GGML_TYPE_F32: llama.cpp's KV cache is F16 by default, which alone moves
# logits by ~1e-3; with F32 it rounds only where the weights' type makes it.
KV_F32 = 0


def model(path: str, n_ctx: int = 256) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                           n_threads=2, verbose=False, seed=0, type_k=KV_F32, type_v=KV_F32,
                           flash_attn=False)


def logits(path: str, ids_path: str, out: str) -> None:
    ids = json.load(open(ids_path))
    llm = model(path)
    llm.eval(ids)
    rows = [[float(x) for x in llm.scores[i]] for i in range(len(ids))]
    json.dump({"llama_cpp_version": llama_cpp.__version__, "logits": rows}, open(out, "w"))


def tokenize(path: str, texts_path: str, out: str) -> None:
    texts = json.load(open(texts_path))
    llm = model(path)
    ids = [llm.tokenize(t.encode(), add_bos=False, special=True) for t in texts]
    json.dump({"llama_cpp_version": llama_cpp.__version__, "ids": ids}, open(out, "w"))


def detokenize(path: str, ids_path: str, out: str) -> None:
    ids = json.load(open(ids_path))
    text = model(path).detokenize(ids).decode("utf-8", errors="replace")
    json.dump({"llama_cpp_version": llama_cpp.__version__, "text": text}, open(out, "w"))


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "quantize":
        quantize(args[0], args[1], args[2], len(args) > 3 and args[3] == "pure")
    elif cmd == "logits":
        logits(*args)
    elif cmd == "tokenize":
        tokenize(*args)
    elif cmd == "detokenize":
        detokenize(*args)
    else:
        raise SystemExit(f"unknown command {cmd}")
