#!/usr/bin/env python3
"""Writes messages_golden.json: Anthropic Messages API requests and the
prompts vLLM renders for them.

Run from the repository root after `make test-deps`:

    python3 engines/chat/testdata/messages_golden.py

vLLM serves /v1/messages by converting the request to a chat completion
request (vllm/entrypoints/anthropic/serving.py) and rendering that. The
conversion is restated here in Python, where json.dumps, str.join and the
dict semantics are the ones vLLM runs, and rendered by golden.py's
rendering. A case vLLM's releases convert differently (a system-role
message, ctx and msg roles, thinking disabled, a tool's strict) or whose
prompt is not the template's alone (images, a tool_use without id) is
written with "exact": false and no prompt.
"""

import json
import os

import jinja2

from golden import MODELS, ROOT, SPECIAL, render

BILLING = "x-anthropic-billing-header"


def blocks_text(blocks):
    return "".join(b["text"] for b in blocks
                   if b["type"] == "text" and b.get("text") and not b["text"].startswith(BILLING))


def system_text(message):
    """A system-role message's text, as newer releases read it."""
    content = message["content"]
    if isinstance(content, str):
        return "" if content.startswith(BILLING) else content
    return blocks_text(content)


def join(*texts):
    return "\n\n".join(t for t in texts if t)


def move_out_of_tool_runs(messages):
    """Newer releases move a system-role message that comes between a
    tool_use and its results past them."""
    out, held, awaiting = [], [], False
    for m in messages:
        if m["role"] == "system":
            (held if awaiting else out).append(m)
            continue
        if m["role"] == "assistant":
            out.extend(held)
            held = []
        out.append(m)
        if m["role"] == "user":
            out.extend(held)
            held = []
        awaiting = m["role"] == "assistant" and isinstance(m["content"], list) and any(
            b["type"] == "tool_use" for b in m["content"])
    return out + held


def place_system(req, messages, inline):
    """The system message's text and the messages left to convert, system
    placeholders ({"role": "system", "text": ...}) among them, as the
    release named by inline places system-role messages: "hoist" (earlier
    releases), "preserve" (newer ones keeping them in place); None when
    that release folds them instead."""
    system = req.get("system")
    if inline == "hoist":
        parts = [system] if isinstance(system, str) and system else []
        if isinstance(system, list):
            parts += [b["text"] for b in system if b["type"] == "text" and b.get("text")
                      and not b["text"].startswith(BILLING)]
        for m in messages:
            if m["role"] != "system":
                continue
            if isinstance(m["content"], str):
                parts.append(m["content"])
            else:
                parts += [b["text"] for b in m["content"] if b["type"] == "text" and b.get("text")
                          and not b["text"].startswith(BILLING)]
        rest = [m for m in messages if m["role"] != "system"]
        return ("".join(parts) if parts else None), rest
    top = (system or "") if system is None or isinstance(system, str) else blocks_text(system)
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    leading = join(*(system_text(m) for m in messages[:lead]))
    rest = move_out_of_tool_runs(messages[lead:])
    if any(m["role"] == "system" and system_text(m) for m in rest) and not (top or leading):
        return None  # folded into user turns
    rest = [{"role": "system", "text": system_text(m)} if m["role"] == "system" else m for m in rest]
    return join(top, leading), rest


def to_chat(req, inline):
    """The chat request vLLM makes of req when it places system-role
    messages as inline says ("hoist", "preserve", or "" for not known),
    and whether that is the chat every such release makes."""
    exact = True
    # Newer releases refuse ctx and msg; an older one reads them as user.
    if any(m["role"] in ("ctx", "msg") for m in req["messages"]):
        exact = False
    messages = [dict(m, role={"ctx": "user", "msg": "user"}.get(m["role"], m["role"]))
                for m in req["messages"]]
    if any(m["role"] == "system" for m in messages) and inline == "":
        exact = False
    placed = place_system(req, messages, inline or "preserve")
    if placed is None:
        return None, False
    system, messages = placed
    out = [{"role": "system", "content": system}] if system is not None and (system or inline == "hoist") else []
    for m in messages:
        if m["role"] == "system":
            if m["text"]:
                out.append({"role": "system", "content": m["text"]})
            continue
        if isinstance(m["content"], str):
            out.append({"role": m["role"], "content": m["content"]})
            continue
        msg, parts, calls, reasoning = {"role": m["role"]}, [], [], []
        for b in m["content"]:
            kind = b["type"]
            if kind == "text" and b.get("text"):
                parts.append({"type": "text", "text": b["text"]})
            elif kind == "image" and b.get("source"):
                exact = False
            elif kind == "thinking" and b.get("thinking") is not None:
                reasoning.append(b["thinking"])
            elif kind == "tool_use":
                if not b.get("id"):
                    exact = False
                calls.append({"id": b.get("id"), "type": "function", "function": {
                    "name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})}})
            elif kind == "tool_result":
                content = b.get("content")
                if m["role"] != "user":
                    if isinstance(content, list) and content:
                        exact = False
                    parts.append({"type": "text", "text": f"Tool result: {str(content) if content else ''}"})
                    continue
                text = content if isinstance(content, str) else ""
                if isinstance(content, list):
                    texts = []
                    for item in content:
                        if item.get("type") == "text":
                            texts.append(item.get("text", ""))
                        elif item.get("type") in ("image", "tool_reference"):
                            exact = False
                    try:
                        text = "\n".join(texts)
                    except TypeError:
                        exact = False
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "", "content": text or ""})
        if reasoning:
            msg["reasoning"] = "".join(reasoning)
        if calls:
            msg["tool_calls"] = calls
        if parts:
            msg["content"] = parts[0]["text"] if len(parts) == 1 else parts
        if m["role"] != "user" or "content" in msg:
            out.append(msg)
    chat = {"messages": out}
    if req.get("tools") is not None:
        if not req["tools"]:
            exact = False
        chat["tools"] = []
        for t in req["tools"]:
            schema = dict(t["input_schema"])
            schema.setdefault("type", "object")
            if t.get("strict") is not None:
                exact = False
            chat["tools"].append({"type": "function", "function": {
                "name": t["name"], "description": t.get("description"), "parameters": schema,
                "defer_loading": t.get("defer_loading")}})
    effort = (req.get("output_config") or {}).get("effort")
    if (req.get("thinking") or {}).get("type") == "disabled":
        exact = False
    if effort is not None:
        chat["reasoning_effort"] = effort
    if req.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = req["chat_template_kwargs"]
    return chat, exact


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


def text(t, **kw):
    return dict({"type": "text", "text": t}, **kw)


EPHEMERAL = {"cache_control": {"type": "ephemeral"}}
BILLING_BLOCK = text("x-anthropic-billing-header: cc_version=2.1.3; cch=5f1e2;")
READ = {"name": "Read", "description": "Reads a file from the local filesystem.",
        "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string", "description": "The absolute path"},
            "offset": {"type": "number"}, "limit": {"type": "number"}},
            "required": ["file_path"], "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}}
BASH = {"name": "Bash", "input_schema": {"properties": {
    "command": {"type": "string"}, "timeout": {"type": "number", "default": 120000}}}}
TOOL_LOOP = [
    user([text("<system-reminder>\nAs you answer, use the context.\n</system-reminder>"),
          text("Why does `make test` fail?", **EPHEMERAL)]),
    assistant([{"type": "thinking", "thinking": "Run the tests first.", "signature": "EqQBCkYIB"},
               text("Let me run them."),
               {"type": "tool_use", "id": "toolu_01A", "name": "Bash",
                "input": {"command": "make test 2>&1 | tail -n 20", "timeout": 600000,
                          "description": "Run the tests — “quoted”, tab\tand 🙂"}}]),
    user([{"type": "tool_result", "tool_use_id": "toolu_01A",
           "content": "FAIL: TestX (0.00s)\n    x_test.go:12: got 1, want 2"},
          text("It is TestX.", **EPHEMERAL)]),
    assistant([{"type": "tool_use", "id": "toolu_01B", "name": "Read",
                "input": {"file_path": "/repo/x_test.go", "offset": 1.5, "limit": 2000}},
               {"type": "tool_use", "id": "toolu_01C", "name": "Read", "input": {}}]),
    user([{"type": "tool_result", "tool_use_id": "toolu_01B", "content": [
              text("1\tpackage x"), text("12\t\tif got != 2 {")]},
          {"type": "tool_result", "tool_use_id": "toolu_01C", "is_error": True, "content": None}]),
    assistant([{"type": "redacted_thinking", "data": "EmwKAhgBEgy"}, text("The test expects 2.")]),
    user("Fix it."),
]

CASES = [
    ("system-string", {"system": "You are terse.", "messages": [user("Hi")]}),
    ("system-blocks-billing", {"system": [BILLING_BLOCK, text("You are Claude Code. "), text(""),
                                          text("Be brief.", **EPHEMERAL)],
                               "messages": [user([text("Hi", **EPHEMERAL)])]}),
    ("text-blocks", {"messages": [user([text("First."), text("Second.")]), assistant([text("Answer.")]),
                                  user([text("Again", **EPHEMERAL)])]}),
    ("empty-turns", {"messages": [user("a"), user([text("")]), assistant([]), assistant([text("")]),
                                  user("b")]}),
    ("ctx-msg-roles", {"messages": [{"role": "ctx", "content": "context"},
                                    {"role": "msg", "content": [text("question")]}]}),
    ("prefill", {"messages": [user("List three colours."), assistant("1.")]}),
    ("claude-code-tool-loop", {"system": [BILLING_BLOCK, text("You are Claude Code.")],
                               "tools": [READ, BASH], "messages": TOOL_LOOP,
                               "output_config": {"effort": "high"}, "thinking": {"type": "adaptive"}}),
    ("thinking-in-tool-loop", {"system": "You are Claude Code.", "tools": [BASH], "messages": [
        TOOL_LOOP[0], TOOL_LOOP[1], user([{"type": "tool_result", "tool_use_id": "toolu_01A", "content": [
            text("FAIL"), text(""), text("ok")]}])], "output_config": {"effort": "medium"}}),
    ("assistant-tool-result", {"messages": [user("Go on."), assistant([
        {"type": "tool_result", "tool_use_id": "t", "content": "done"}, text("Next.")]), user("ok")]}),
    ("user-tool-use-dropped", {"messages": [user("Hi"), user([
        {"type": "tool_use", "id": "t", "name": "x", "input": {}}]), user("there")]}),
    ("defer-loading", {"tools": [dict(READ, defer_loading=True), dict(BASH, defer_loading=None)],
                       "messages": [user("Read it.")]}),
    ("kwargs-thinking-off", {"chat_template_kwargs": {"enable_thinking": False},
                             "messages": [user("2+2?")], "thinking": {"type": "enabled", "budget_tokens": 1024}}),
    ("effort-low", {"output_config": {"effort": "low"}, "messages": [user("2+2?")]}),
    ("inline-system", {"system": "S", "messages": [user("a"), {"role": "system", "content": "note"}, user("b")]}),
    ("leading-system", {"messages": [{"role": "system", "content": [text("S")]}, user("a")]}),
    # Newer Claude Code's loop: a system-role message most turns, one of
    # them between a tool call and its result (moved past the result by
    # newer releases), one empty, one with the billing header, blocks.
    ("inline-system-loop", {"system": [BILLING_BLOCK, text("You are Claude Code.")], "tools": [READ],
                            "output_config": {"effort": "high"}, "messages": [
        {"role": "system", "content": "Leading note."},
        {"role": "system", "content": [text("Second "), text("leading note.")]},
        user("Why does make test fail?"),
        {"role": "system", "content": "<system-reminder>todo list empty</system-reminder>"},
        assistant([{"type": "thinking", "thinking": "Read it.", "signature": "s"},
                   {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/r/a.go"}}]),
        {"role": "system", "content": "Held: the tool is still running."},
        {"role": "system", "content": ""},
        {"role": "system", "content": "x-anthropic-billing-header: cch=9;"},
        user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "package a"}, text("Go on.")]),
        assistant([{"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"file_path": "/r/b.go"}}]),
        {"role": "system", "content": [text("Held until the next assistant turn.")]},
        assistant("Still reading."),
        {"role": "system", "content": "Trailing note."},
    ]}),
    ("inline-system-without-system-text", {"messages": [user("a"), {"role": "system", "content": "note"}, user("b")]}),
    ("leading-system-only", {"messages": [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"}, user("a")]}),
    ("thinking-disabled", {"thinking": {"type": "disabled"}, "messages": [user("a")]}),
    ("tool-strict", {"tools": [dict(READ, strict=True)], "messages": [user("a")]}),
    ("empty-tools", {"tools": [], "messages": [user("a")]}),
    ("image", {"messages": [user([{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                               "data": "iVBORw0KGgo="}}, text("What is it?")])]}),
    ("tool-use-without-id", {"messages": [user("a"), assistant([{"type": "tool_use", "name": "x", "input": {}}]),
                                          user([{"type": "tool_result", "tool_use_id": "", "content": "r"}])]}),
    ("tool-result-image", {"messages": [user("a"), assistant([{"type": "tool_use", "id": "t", "name": "x"}]),
                                        user([{"type": "tool_result", "tool_use_id": "t", "content": [
                                            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}])]}),
    ("tool-result-null-text", {"messages": [user("a"), assistant([{"type": "tool_use", "id": "t", "name": "x"}]),
                                            user([{"type": "tool_result", "tool_use_id": "t",
                                                   "content": [{"type": "text", "text": None}]}])]}),
    ("assistant-tool-result-list", {"messages": [user("a"), assistant([
        {"type": "tool_result", "tool_use_id": "t", "content": [text("r")]}])]}),
]


def main():
    out = []
    for model, rel in MODELS.items():
        path = rel if os.path.isabs(rel) else os.path.join(ROOT, rel)
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            cfg = json.load(f)
        special = {k: cfg[k] for k in SPECIAL if isinstance(cfg.get(k), str)}
        for name, request in CASES:
            request = dict(request, model=model, max_tokens=1024)
            inlines = [""]
            if any(m["role"] == "system" for m in request["messages"]):
                inlines += ["hoist", "preserve"]
            for inline in inlines:
                chat, exact = to_chat(request, inline)
                case = {"model": model, "name": name, "inline": inline, "request": request, "exact": exact}
                if exact:
                    try:
                        case["want"] = render(cfg["chat_template"], special, chat, {})
                    except jinja2.exceptions.TemplateError as e:
                        case["error"] = str(e)
                out.append(case)
    with open(os.path.join(os.path.dirname(__file__), "messages_golden.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
