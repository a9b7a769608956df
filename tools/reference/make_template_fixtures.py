#!/usr/bin/env python3
"""Chat templates rendered by transformers, for Longhaul's template tests.

Each case is a template written to exercise what published templates use
(`tojson` with `separators`, `ensure_ascii`, `indent`, `sort_keys`; Python's
printing of None, booleans, floats, lists and dicts; `strftime_now(format)`;
`dict(...)`, `namespace`, loop controls, macros, list and string methods;
switches such as `enable_thinking`) with its inputs, and what
`transformers.utils.chat_template_utils.render_jinja_template` renders from
them (or the error class it raises). `strftime_now` is pinned to one instant
so the output is reproducible.

Reference tooling only (transformers and jinja2 from PyPI); never in CI.

    python3 tools/reference/make_template_fixtures.py engine/tests/fixtures/templates
"""

import datetime as dt
import json
import sys
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils

# Noon UTC: the same date in every time zone within 11 hours of UTC.
NOW = 1781524800  # 2026-06-15 12:00:00 UTC


class FixedDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return dt.datetime.fromtimestamp(NOW, tz)


chat_template_utils.datetime = FixedDatetime

MESSAGES = [
    {"role": "system", "content": "You audit code. Be brief."},
    {"role": "user", "content": "Read <main.rs> & say \"why\" — über 漢字 🙂"},
    {"role": "assistant", "content": "  It's fine.  "},
    {"role": "user", "content": "Again?\nTwo lines."},
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Reads a file <safely> & quickly",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Pfad — über"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1e16, "default": 0.5},
                    "scale": {"type": "number", "default": 1e-05, "examples": [1.0, 2.5, -0.0]},
                    "flags": {"type": "array", "items": {"type": "boolean"}, "default": [True, False, None]},
                },
                "required": ["path"],
            },
        },
    }
]

CASES = {
    # transformers' tojson: json.dumps, no HTML escaping, Python floats.
    "tojson_variants": (
        "{{ tools | tojson }}\n"
        "{{ tools | tojson(separators=(',', ':')) }}\n"
        "{{ tools | tojson(ensure_ascii=True) }}\n"
        "{{ tools[0] | tojson(indent=2) }}\n"
        "{{ tools[0].function.parameters | tojson(indent=4, sort_keys=True) }}\n"
        "{{ {'b': [], 'a': {}, 'c': [1]} | tojson(indent='\t') }}\n"
        "{{ messages[1].content | tojson }}|{{ messages[1].content | tojson(ensure_ascii=True) }}\n"
        "{{ [none, true, false, 0, -7, 12345678901234567890] | tojson }}\n",
        {"tools": TOOLS},
    ),
    # `{{ x }}` is Python's str(x).
    "python_printing": (
        "{{ none }}|{{ true }}|{{ false }}|{{ 1.5 }}|{{ 1e16 }}|{{ 0.1 + 0.2 }}|{{ 10 / 4 }}|{{ 7 // 2 }}\n"
        "{{ [1, 'a', none, true, 2.0, \"it's\"] }}\n"
        "{{ {'k': 'v', 'n': none, 'l': [1]} }}\n"
        "{{ messages[0] }}\n"
        "{{ undefined_name }}|{{ messages | length }}\n",
        {},
    ),
    "strftime_now": (
        "Today is {{ strftime_now('%d %b %Y') }} ({{ strftime_now('%A, %B %d') }}); ISO {{ strftime_now('%Y-%m-%d') }}; "
        "day {{ strftime_now('%j') }}, 100%% sure: {{ strftime_now('%%') }}\n",
        {},
    ),
    "methods_and_dict": (
        "{% set xs = [3, 1, 2, 1] %}{{ xs.index(2) }} {{ xs.count(1) }} {{ xs.copy() }}\n"
        "{{ 'a,b,,c'.split(',') }} {{ '  pad  '.strip() }}|{{ 'x-y'.replace('-', '+') }} {{ 'Title me'.upper() }}"
        " {{ 'abc'.startswith('ab') }} {{ 'hello world'.title() }}\n"
        "{% set d = dict(b=2, a=1) %}{{ d | tojson }} {{ dict(d, c=3, a=9) | tojson }} {{ d.get('z', 'none-here') }}\n"
        "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}\n",
        {},
    ),
    # What Kimi K2's template uses: macros, a namespace found by a reverse
    # loop with break, slices, compact tool JSON.
    "kimi_like": (
        "{%- macro render_content(msg) -%}\n"
        "    {%- set c = msg.get('content') -%}\n"
        "    {%- if c is string -%}\n"
        "      {{ c }}\n"
        "    {%- elif c is not none -%}\n"
        "      {% for part in c -%}{{ part['text'] }}{%- endfor -%}\n"
        "    {%- endif -%}\n"
        "{%- endmacro -%}\n"
        "{%- set ns = namespace(last=-1) -%}\n"
        "{%- for idx in range(messages|length-1, -1, -1) -%}\n"
        "    {%- if messages[idx]['role'] == 'assistant' -%}\n"
        "        {%- set ns.last = idx -%}\n"
        "        {%- break -%}\n"
        "    {%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- if tools -%}\n"
        "  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>\n"
        "{%- endif -%}\n"
        "{%- for message in messages[:ns.last+1] -%}\n"
        "  <|im_{{ message['role'] }}|>{{ message.get('name') or message['role'] }}<|im_middle|><think></think>{{ render_content(message) }}<|im_end|>\n"
        "{%- endfor -%}\n"
        "{%- for message in messages[ns.last+1:] -%}\n"
        "  <|im_{{ message['role'] }}|>{{ message['role'] }}<|im_middle|>{{ render_content(message) }}<|im_end|>\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        "  <|im_assistant|>assistant<|im_middle|>\n"
        "{%- endif -%}",
        {"tools": TOOLS},
    ),
    # GLM's and MiniMax's: tojson(ensure_ascii=False), trim_blocks and
    # lstrip_blocks whitespace, a thinking switch.
    "glm_like": (
        "[gMASK]<sop>\n"
        "{% if tools %}\n"
        "<|system|>\n# Tools\n"
        "  {% for tool in tools %}\n"
        "{{ tool | tojson(ensure_ascii=False) }}\n"
        "  {% endfor %}\n"
        "{% endif %}\n"
        "{% for m in messages %}\n"
        "    {% if m.role == 'user' %}\n"
        "<|user|>\n{{ m.content }}{{ '/nothink' if enable_thinking is defined and not enable_thinking }}\n"
        "    {% elif m.role == 'assistant' %}\n"
        "<|assistant|>\n<think></think>\n{{ m.content.strip() }}\n"
        "    {% else %}\n"
        "<|{{ m.role }}|>\n{{ m.content }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}<|assistant|>{{ '\\n<think></think>' if enable_thinking is defined and not enable_thinking else '' }}{% endif %}",
        {"tools": TOOLS, "enable_thinking": False},
    ),
    "reasoning_effort": (
        "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}\n"
        "Current date: {{ strftime_now('%Y-%m-%d') }}<|end|>"
        "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|start|>assistant{% endif %}",
        {"reasoning_effort": "high"},
    ),
    "loop_controls": (
        "{% for m in messages %}{% if loop.index0 == 2 %}{% continue %}{% endif %}"
        "{{ loop.index }}:{{ m.role }}{{ ',' if not loop.last }}{% endfor %}\n"
        "{{ messages | map(attribute='role') | join('/') }} {{ messages[-1].content | length }}",
        {},
    ),
    # transformers' sandbox refuses to change a list.
    "list_append_refused": (
        "{% set xs = [] %}{% for m in messages %}{{ xs.append(m.role) }}{% endfor %}{{ xs }}",
        {},
    ),
    "raise_exception": (
        "{% if messages[0].role == 'system' %}{{ raise_exception('System messages are not supported') }}{% endif %}",
        {},
    ),
}


def render(template: str, args: dict, add_generation_prompt: bool):
    try:
        out = chat_template_utils.render_jinja_template(
            conversations=[MESSAGES],
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            bos_token="<s>",
            eos_token="</s>",
            **args,
        )
        rendered = out[0] if isinstance(out, tuple) else out
        return {"expected": rendered[0]}
    except (jinja2.exceptions.TemplateError, jinja2.exceptions.SecurityError) as e:
        return {"error": type(e).__name__, "message": str(e)}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "engine/tests/fixtures/templates")
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, (template, args) in CASES.items():
        for agp in (True, False):
            case = {"name": name, "template": template, "args": args, "add_generation_prompt": agp}
            case.update(render(template, args, agp))
            cases.append(case)
    expected = {
        "transformers_version": transformers.__version__,
        "jinja2_version": jinja2.__version__,
        "now": NOW,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "messages": MESSAGES,
        "cases": cases,
    }
    (out / "cases.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False))
    for c in cases:
        print(c["name"], c["add_generation_prompt"], "error" if "error" in c else len(c["expected"]))


if __name__ == "__main__":
    main()
