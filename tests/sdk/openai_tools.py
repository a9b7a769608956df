#!/usr/bin/env python3
"""OpenAI's own Python SDK against `longhaul serve`: chat with tools, a tool
result sent back for the second turn, the same call streamed as deltas, and
refusals the SDK raises as the right exceptions.

The model is `assets/longhaul-demo-tools`, trained to call tools as Qwen3
does, so every answer here is the model's own (greedy, so the same on every
run). Loopback only; each request is bounded by the client's timeout.

    python tests/sdk/openai_tools.py PATH/TO/longhaul

Prints one `ok N - …` or `not ok N - …` line per check and `# pass` /
`# fail` totals, as the browser tests do.
"""

import json
import re
import sys
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import SLOW_FAULTS, Service, run_checks  # noqa: E402

TIMEOUT_SECONDS = 120
MODEL = "tools"
TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]},
    }}
    for name, description, param in [
        ("read_file", "Reads a file of the project.", "path"),
        ("list_files", "Lists the files in a folder of the project.", "folder"),
        ("search", "Finds the lines of the project that mention a word.", "pattern"),
    ]
]
QUESTION = "What does src/cache.rs do?"
FILE_TEXT = "// src/cache.rs: keeps the hottest experts in memory."


def first_turn(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "read_file", call
    assert json.loads(call.function.arguments) == {"path": "src/cache.rs"}, call.function.arguments
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage
    print(f"# turn 1: {call.function.name}({call.function.arguments}) id={call.id}")


def second_turn(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": FILE_TEXT},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls, choice
    assert "keeps the hottest experts in memory" in choice.message.content, choice.message.content
    print(f"# turn 2: {choice.message.content!r}")


def streamed(client: openai.OpenAI) -> None:
    """The call streams as OpenAI streams one: id and name first, then the
    arguments in fragments (the service is slowed to a token per event)."""
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                            tools=TOOLS, stream=True, stream_options={"include_usage": True})
    calls, finish, content, usage, fragments = {}, None, "", None, 0
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                assert not d.id or not c["id"], f"a second id for call {d.index}: {d}"
                c["id"] += d.id or ""
                c["name"] += (d.function.name or "") if d.function else ""
                arguments = (d.function.arguments or "") if d.function else ""
                assert c["id"] and c["name"], f"arguments before the call's id and name: {d}"
                c["arguments"] += arguments
                fragments += bool(arguments)
            finish = choice.finish_reason or finish
    assert finish == "tool_calls", finish
    assert content == "", content
    assert [c["name"] for c in calls.values()] == ["read_file"], calls
    assert json.loads(calls[0]["arguments"]) == {"path": "src/cache.rs"}, calls
    assert fragments > 1, f"the arguments came in {fragments} fragment(s)"
    assert usage is not None and usage.completion_tokens > 0, usage
    print(f"# streamed: {calls[0]['name']}({calls[0]['arguments']}) in {fragments} fragments, finish {finish}")


def no_tools_no_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2 plus 3?"}],
                                       tools=TOOLS)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls, r
    assert re.fullmatch(r"\d+\.", r.choices[0].message.content), r.choices[0].message.content


def forced_calls(client: openai.OpenAI) -> None:
    # A question the model answers without a tool: a forced choice makes it call one.
    sum_question = [{"role": "user", "content": "What is 2 plus 3?"}]
    for choice, names in [({"type": "function", "function": {"name": "search"}}, {"search"}),
                          ("required", {"read_file", "list_files", "search"})]:
        r = client.chat.completions.create(model=MODEL, messages=sum_question, tools=TOOLS, tool_choice=choice)
        assert r.choices[0].finish_reason == "tool_calls", r
        [call] = r.choices[0].message.tool_calls
        assert call.function.name in names, (choice, call)
        assert isinstance(json.loads(call.function.arguments), dict), call
        print(f"# forced {choice}: {call.function.name}({call.function.arguments})")
    first = client.responses.create(model=MODEL, input="What is 2 plus 3?", tools=FLAT_TOOLS,
                                    tool_choice={"type": "function", "name": "list_files"})
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "list_files", first


def refusals(client: openai.OpenAI) -> None:
    ask = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "tools": TOOLS}
    for extra, param in [({"tool_choice": {"type": "function", "function": {"name": "delete_all"}}}, "tool_choice"),
                         ({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"messages": [{"role": "user", "content": "word " * 5000}]}, "max_tokens"),
                         ({"frequency_penalty": 2.5}, "frequency_penalty")]:
        try:
            client.chat.completions.create(**{**ask, **extra})
        except openai.BadRequestError as e:
            assert e.body["param"] == param, e.body
        else:
            raise AssertionError(f"{extra} was accepted")
    # Penalties in range are honoured, repetition_penalty as vLLM's extra field.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 2 plus 3?"}],
                                       frequency_penalty=0.5, presence_penalty=0.2,
                                       extra_body={"repetition_penalty": 1.1}, max_tokens=8)
    assert r.choices[0].message.content, r


FLAT_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
               "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]


def responses_turns(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input=QUESTION, tools=FLAT_TOOLS)
    assert first.status == "completed", first
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "read_file" and json.loads(call.arguments) == {"path": "src/cache.rs"}, call
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=FLAT_TOOLS, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": FILE_TEXT}])
    assert "keeps the hottest experts in memory" in second.output_text, second.output_text
    again = client.responses.retrieve(second.id)
    assert again.output_text == second.output_text and again.status == "completed", again
    print(f"# responses: {call.name}({call.arguments}) then {second.output_text!r}")


def responses_streamed(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input=QUESTION, tools=FLAT_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    [call] = [o for o in final.output if o.type == "function_call"]
    assert json.loads(call.arguments) == {"path": "src/cache.rs"}, call
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == call.arguments, deltas
    added = kinds.index("response.output_item.added", kinds.index("response.in_progress"))
    assert added < kinds.index("response.function_call_arguments.delta") < kinds.index(
        "response.function_call_arguments.done") < kinds.index("response.output_item.done"), kinds
    plain = client.responses.create(model=MODEL, input="What is 2 plus 3?", stream=True)
    text = "".join(e.delta for e in plain if e.type == "response.output_text.delta")
    assert re.fullmatch(r"\d+\.", text), text
    print(f"# responses streamed: {len(kinds)} events, the arguments in {len(deltas)} deltas")


def client_of(service: Service) -> openai.OpenAI:
    service.add_model(MODEL, Path(__file__).resolve().parents[2] / "assets/longhaul-demo-tools")
    return openai.OpenAI(base_url=f"{service.url}/v1", api_key=service.token,
                         timeout=TIMEOUT_SECONDS, max_retries=0)


def main() -> int:
    binary = Path(sys.argv[1])
    with Service(binary) as service, Service(binary, SLOW_FAULTS) as slowed:
        client, slow = client_of(service), client_of(slowed)
        return run_checks("openai", client, [first_turn, second_turn, (streamed, slow), no_tools_no_call,
                                             forced_calls, refusals, responses_turns, (responses_streamed, slow)])


if __name__ == "__main__":
    sys.exit(main())
