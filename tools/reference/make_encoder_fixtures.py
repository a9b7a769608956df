#!/usr/bin/env python3
"""Prompt text from DeepSeek's own encoders, for Longhaul's encoder tests.

DeepSeek-V3.2 and V4 ship no chat template: `encoding/encoding_dsv32.py`
and `encoding/encoding_dsv4.py` in their release folders build prompts.
This script runs those files (give the folders that hold them) on
conversations written to exercise them — chat and thinking modes, tools in
the system or developer message, tool calls with string, number, list and
nested arguments, tool results (out of call order for V4), response
formats, V4's latest reminders, tasks and reasoning efforts — and records
what each returns, or that it raises.

Reference tooling only; never in CI, and the encoders are not committed.

    python3 tools/reference/make_encoder_fixtures.py DSV32_ENCODING_DIR DSV4_ENCODING_DIR \
        engine/tests/fixtures/encoders
"""

import copy
import importlib.util
import json
import sys
from pathlib import Path

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Reads a file of the project",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Pfad — relativ"},
                    "lines": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Runs the test suite",
            "parameters": {"type": "object", "properties": {"filter": {"type": "string"}, "jobs": {"type": "number"}}},
        },
    },
]

CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": "src/main.rs", "lines": [1, 40]})}},
    {"id": "call_2", "type": "function", "function": {"name": "run_tests", "arguments": json.dumps({"filter": "store::", "jobs": 2.5, "opts": {"quiet": True, "env": None}}, ensure_ascii=False)}},
]


def conversations():
    base = [
        {"role": "system", "content": "You audit code. Be brief."},
        {"role": "user", "content": "What does the storage engine do? 漢字 🙂"},
    ]
    history = base + [
        {"role": "assistant", "content": "It reads experts from drives.", "reasoning_content": "The user asks about storage."},
        {"role": "user", "content": "And the cache?"},
    ]
    tools = [
        dict(base[0], tools=TOOLS),
        {"role": "user", "content": "Read main.rs and run the store tests."},
        {"role": "assistant", "content": "", "reasoning_content": "I need the file and the tests.", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_1", "content": "fn main() {}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok: 12 passed"},
        {"role": "assistant", "content": "main.rs is empty; 12 tests pass.", "reasoning_content": "Both results are in."},
        {"role": "user", "content": "Thanks. Anything else?"},
    ]
    unordered = copy.deepcopy(tools[:5])
    unordered[3], unordered[4] = unordered[4], unordered[3]
    response_format = [
        dict(base[0], response_format={"type": "json_object", "schema": {"answer": "string", "score": 0.5}}),
        base[1],
    ]
    developer = [
        {"role": "developer", "content": "Use the tools when needed.", "tools": TOOLS},
        {"role": "user", "content": "List the files."},
    ]
    plain_args = [
        base[0],
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "run_tests", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ]
    v4_extras = [
        {"role": "system", "content": "Answer tersely."},
        {"role": "user", "content": "Summarise the README.", "task": "query"},
        {"role": "assistant", "content": "A storage engine.", "wo_eos": True},
        {"role": "latest_reminder", "content": "Today is 2026-06-15."},
        {"role": "user", "content": "Now act.", "task": "action"},
    ]
    return {
        "single_turn": base,
        "history": history,
        "tools": tools,
        "tools_unordered_results": unordered,
        "response_format": response_format,
        "developer_with_tools": developer,
        "arguments_not_json": plain_args,
        "v4_tasks_and_reminders": v4_extras,
    }


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(encode, messages, **kwargs):
    try:
        return {"expected": encode(copy.deepcopy(messages), **kwargs)}
    except Exception as e:  # the release's asserts and errors
        return {"error": type(e).__name__, "message": str(e)}


def main() -> None:
    dsv32_dir, dsv4_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    dsv32 = load(dsv32_dir, "encoding_dsv32")
    dsv4 = load(dsv4_dir, "encoding_dsv4")
    cases = []
    for name, messages in conversations().items():
        for mode in ("chat", "thinking"):
            if not name.startswith("v4_"):
                case = {"encoder": "encoding_dsv32", "name": name, "thinking_mode": mode, "messages": messages}
                case.update(run(dsv32.encode_messages, messages, thinking_mode=mode))
                cases.append(case)
            for effort in (None, "high", "max"):
                if effort and mode == "chat":
                    continue
                case = {"encoder": "encoding_dsv4", "name": name, "thinking_mode": mode, "reasoning_effort": effort, "messages": messages}
                case.update(run(dsv4.encode_messages, messages, thinking_mode=mode, reasoning_effort=effort))
                cases.append(case)
    (out / "cases.json").write_text(json.dumps({"cases": cases}, ensure_ascii=False, indent=1))
    for c in cases:
        print(c["encoder"], c["name"], c["thinking_mode"], c.get("reasoning_effort"), c.get("error") or len(c["expected"]))


if __name__ == "__main__":
    main()
