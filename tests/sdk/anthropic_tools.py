#!/usr/bin/env python3
"""Anthropic's own Python SDK against `longhaul serve`: messages with tools,
a tool_result sent back for the second turn, the same call through the
SDK's streaming helper, count_tokens, and refusals raised as the SDK's own
exceptions. The model is `assets/longhaul-demo-tools` (greedy, so the same
answers on every run); loopback only, each request bounded.

    python tests/sdk/anthropic_tools.py PATH/TO/longhaul
"""

import json
import re
import sys
from pathlib import Path

import anthropic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import SLOW_FAULTS, Service, run_checks  # noqa: E402

MODEL = "tools"
TOOLS = [
    {"name": "read_file", "description": "Reads a file of the project.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "list_files", "description": "Lists the files in a folder of the project.",
     "input_schema": {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}},
    {"name": "search", "description": "Finds the lines of the project that mention a word.",
     "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}},
]
QUESTION = "What does src/cache.rs do?"
MAX_TOKENS = 64


def ask(client: anthropic.Anthropic, messages: list, **extra):
    return client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, tools=TOOLS, messages=messages, **extra)


def first_turn(client: anthropic.Anthropic) -> None:
    m = ask(client, [{"role": "user", "content": QUESTION}])
    assert m.stop_reason == "tool_use", m
    [use] = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "read_file" and use.input == {"path": "src/cache.rs"}, use
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0, m.usage
    print(f"# turn 1: tool_use {use.name}({use.input}) id={use.id}")


def second_turn(client: anthropic.Anthropic) -> None:
    first = ask(client, [{"role": "user", "content": QUESTION}])
    use = next(b for b in first.content if b.type == "tool_use")
    m = ask(client, [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "// src/cache.rs: keeps the hottest experts in memory."}]},
    ])
    assert m.stop_reason == "end_turn", m
    text = "".join(b.text for b in m.content if b.type == "text")
    assert "keeps the hottest experts in memory" in text, text
    print(f"# turn 2: {text!r}")


def streamed(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, tools=TOOLS,
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert final.stop_reason == "tool_use", final
    [use] = [b for b in final.content if b.type == "tool_use"]
    assert use.input == {"path": "src/cache.rs"}, use
    # The input streams as the model writes it (the service is slowed to a
    # token per event): several input_json_delta pieces that add up to it.
    pieces = [e.delta.partial_json for e in events
              if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == use.input, pieces
    print(f"# streamed: {len(kinds)} events, tool_use {use.name}({use.input}) in {len(pieces)} pieces")


def plain_answer(client: anthropic.Anthropic) -> None:
    m = ask(client, [{"role": "user", "content": "What is 2 plus 3?"}])
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["text"], m
    assert re.fullmatch(r"\d+\.", m.content[0].text), m.content


def count_tokens(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, tools=TOOLS, messages=[{"role": "user", "content": QUESTION}])
    bare = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens > bare.input_tokens > 0, (counted, bare)
    first = ask(client, [{"role": "user", "content": QUESTION}])
    assert first.usage.input_tokens == counted.input_tokens, (first.usage, counted)


def forced_calls(client: anthropic.Anthropic) -> None:
    for choice, names in [({"type": "tool", "name": "search"}, {"search"}),
                          ({"type": "any"}, {"read_file", "list_files", "search"})]:
        m = ask(client, [{"role": "user", "content": "What is 2 plus 3?"}], tool_choice=choice)
        assert m.stop_reason == "tool_use", m
        [use] = [b for b in m.content if b.type == "tool_use"]
        assert use.name in names and isinstance(use.input, dict), (choice, use)
        print(f"# forced {choice}: {use.name}({use.input})")


def refusals(client: anthropic.Anthropic) -> None:
    for extra in [{"tool_choice": {"type": "tool", "name": "delete_all"}}, {"max_tokens": 5000}]:
        try:
            client.messages.create(**{"model": MODEL, "max_tokens": MAX_TOKENS, "tools": TOOLS,
                                      "messages": [{"role": "user", "content": QUESTION}], **extra})
        except anthropic.BadRequestError as e:
            assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
        else:
            raise AssertionError(f"{extra} was accepted")


def client_of(service: Service) -> anthropic.Anthropic:
    service.add_model(MODEL, Path(__file__).resolve().parents[2] / "assets/longhaul-demo-tools")
    return anthropic.Anthropic(base_url=service.url, api_key=service.token, timeout=120, max_retries=0)


def main() -> int:
    binary = Path(sys.argv[1])
    with Service(binary) as service, Service(binary, SLOW_FAULTS) as slowed:
        return run_checks("anthropic", client_of(service),
                          [first_turn, second_turn, (streamed, client_of(slowed)), plain_answer, count_tokens,
                           forced_calls, refusals])


if __name__ == "__main__":
    sys.exit(main())
