#!/usr/bin/env python3
"""The official OpenAI and Anthropic Python SDKs, unmodified, against a charm
server: only the base URL (and a key) change.

Each SDK completes a chat and a streamed chat; the streamed text must equal
the whole one, the usage and finish reasons must be there, and an unknown
model must raise the SDK's own NotFoundError (so the error shapes parse).
Then a tool round trip in each SDK's own shapes (tool definitions, an
assistant call, its result, the tool forced by name), whole and streamed:
the answer must parse in the SDK, and the stream must accumulate to the
whole answer; arguments must validate against the tool's JSON schema.
Structured output: a strict `json_schema` answer (validated with
`jsonschema`, and parsed by the SDK's own `parse()` into a Pydantic model),
`tool_choice="required"` with two tools (the arguments validate), and the
Responses API (a text answer whole and streamed through the SDK's typed
events, a forced function call, its output sent back with
`previous_response_id`).
Prints one JSON object with what each SDK got, for the caller to compare.

Usage: python scripts/test_sdks.py --base-url http://127.0.0.1:PORT --model ID
       [--api-key KEY] [--max-tokens N]
Needs: scripts/sdk_venv.sh (openai, anthropic, jsonschema at pinned versions).
"""

import argparse
import json
import sys
from typing import Literal

import anthropic
import jsonschema
import openai
import pydantic

SYSTEM = "You are terse."
USER = "Say something about hummingbirds."
TOOL_USER = "What is the weather in Paris?"
TOOL_RESULT = "18 C, clear"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lagos", "Lima"]}},
               "required": ["city"], "additionalProperties": False},
}
TIME = {
    "name": "get_time",
    "description": "Local time in a city.",
    "schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lagos"]},
                                                "format": {"type": "string", "enum": ["12h", "24h"]}},
               "required": ["city", "format"], "additionalProperties": False},
}
VERDICT = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
                                            "score": {"type": "integer", "minimum": 0, "maximum": 9}},
           "required": ["answer", "score"], "additionalProperties": False}


class Verdict(pydantic.BaseModel):
    answer: Literal["yes", "no", "maybe"]
    score: int = pydantic.Field(ge=0, le=9)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def run_openai(base, key, model, max_tokens):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    models = [m.id for m in client.models.list()]
    check(model in models, f"openai: models.list() has {model}: {models}")

    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    text = whole.choices[0].message.content
    check(whole.choices[0].finish_reason in ("stop", "length"), f"openai finish_reason {whole.choices[0].finish_reason}")
    check(whole.usage.completion_tokens > 0, "openai usage.completion_tokens > 0")

    pieces, finish, usage = [], None, None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    streamed = "".join(pieces)
    check(streamed == text, f"openai: streamed {streamed!r} != whole {text!r}")
    check(finish == whole.choices[0].finish_reason, f"openai stream finish {finish}")
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, f"openai stream usage {usage}")

    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
        check(False, "openai: an unknown model must fail")
    except openai.NotFoundError as e:
        check("no-such-model" in str(e), f"openai NotFoundError names the model: {e}")
    return {
        "text": text,
        "finish_reason": finish,
        "prompt_tokens": whole.usage.prompt_tokens,
        "completion_tokens": whole.usage.completion_tokens,
    }


def run_openai_tools(base, key, model, max_tokens):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                               "parameters": WEATHER["schema"]}}]
    messages = [
        {"role": "user", "content": TOOL_USER},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
    ]
    kw = dict(model=model, messages=messages, tools=tools, max_tokens=max_tokens, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kw)
    msg, finish = whole.choices[0].message, whole.choices[0].finish_reason
    calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in msg.tool_calls or []]
    check((finish == "tool_calls") == bool(calls), f"openai tools: finish_reason {finish} with calls {calls}")
    check(len(calls) == 1 and calls[0]["name"] == "get_weather", f"openai tools: the forced call {calls}")
    jsonschema.validate(calls[0]["arguments"], WEATHER["schema"])

    content, streamed_calls, stream_finish = [], {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.delta.content:
                content.append(c.delta.content)
            for t in c.delta.tool_calls or []:
                slot = streamed_calls.setdefault(t.index, {"name": "", "arguments": ""})
                if t.function and t.function.name:
                    slot["name"] += t.function.name
                if t.function and t.function.arguments:
                    slot["arguments"] += t.function.arguments
            if c.finish_reason:
                stream_finish = c.finish_reason
    streamed = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(streamed_calls.items())]
    check("".join(content) == (msg.content or ""), f"openai tools: streamed {''.join(content)!r} != {msg.content!r}")
    check(streamed == calls, f"openai tools: streamed calls {streamed} != {calls}")
    check(stream_finish == finish, f"openai tools: stream finish {stream_finish} != {finish}")
    return {"content": msg.content, "calls": calls, "finish_reason": finish,
            "prompt_tokens": whole.usage.prompt_tokens, "completion_tokens": whole.usage.completion_tokens}


def run_anthropic_tools(base, key, model, max_tokens):
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["schema"]}]
    messages = [
        {"role": "user", "content": TOOL_USER},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": TOOL_RESULT}]},
    ]
    kw = dict(model=model, messages=messages, tools=tools, max_tokens=max_tokens, extra_body={"temperature": 0},
              tool_choice={"type": "tool", "name": "get_weather"})

    def summary(m):
        return {"text": "".join(b.text for b in m.content if b.type == "text"),
                "calls": [{"name": b.name, "arguments": b.input} for b in m.content if b.type == "tool_use"],
                "stop_reason": m.stop_reason}

    whole = client.messages.create(**kw)
    got = summary(whole)
    check(whole.stop_reason == "tool_use" and len(got["calls"]) == 1, f"anthropic tools: the forced call {got}")
    jsonschema.validate(got["calls"][0]["arguments"], WEATHER["schema"])
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    check(summary(final) == got, f"anthropic tools: streamed {summary(final)} != {got}")
    got.update(input_tokens=whole.usage.input_tokens, output_tokens=whole.usage.output_tokens,
               cache_read_input_tokens=whole.usage.cache_read_input_tokens or 0)
    return got


def run_anthropic(base, key, model, max_tokens):
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": USER}]
    whole = client.messages.create(
        model=model, max_tokens=max_tokens, system=SYSTEM, messages=messages, extra_body={"temperature": 0}
    )
    check(whole.type == "message" and whole.role == "assistant", f"anthropic message {whole}")
    text = "".join(b.text for b in whole.content if b.type == "text")
    check(whole.stop_reason in ("end_turn", "max_tokens"), f"anthropic stop_reason {whole.stop_reason}")
    check(whole.usage.output_tokens > 0, "anthropic usage.output_tokens > 0")

    with client.messages.stream(
        model=model, max_tokens=max_tokens, system=SYSTEM, messages=messages, extra_body={"temperature": 0}
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(streamed == text, f"anthropic: streamed {streamed!r} != whole {text!r}")
    check(final.stop_reason == whole.stop_reason, f"anthropic stream stop_reason {final.stop_reason}")
    check(final.usage.output_tokens == whole.usage.output_tokens, f"anthropic stream usage {final.usage}")
    # The stream's prompt is the whole answer's, served by the prefix cache.
    prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    check(final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == prompt,
          f"anthropic stream input usage {final.usage}")

    try:
        client.messages.create(model="no-such-model", max_tokens=2, messages=messages)
        check(False, "anthropic: an unknown model must fail")
    except anthropic.NotFoundError as e:
        check("no-such-model" in str(e), f"anthropic NotFoundError names the model: {e}")
    return {
        "text": text,
        "stop_reason": whole.stop_reason,
        "input_tokens": whole.usage.input_tokens,
        "cache_read_input_tokens": whole.usage.cache_read_input_tokens or 0,
        "output_tokens": whole.usage.output_tokens,
    }


def run_openai_structured(base, key, model, max_tokens):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Is the sky green? Answer as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                           response_format=fmt)
    text = whole.choices[0].message.content
    jsonschema.validate(json.loads(text), VERDICT)
    parsed = client.chat.completions.parse(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                           response_format=Verdict)
    check(isinstance(parsed.choices[0].message.parsed, Verdict), f"openai parse(): {parsed.choices[0].message}")

    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["schema"]}} for t in (WEATHER, TIME)]
    req = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Paris?"}], tools=tools,
                                         tool_choice="required", max_tokens=max_tokens, temperature=0)
    calls = req.choices[0].message.tool_calls or []
    check(req.choices[0].finish_reason == "tool_calls" and len(calls) == 1, f"openai required: {req.choices[0]}")
    schema = {t["name"]: t["schema"] for t in (WEATHER, TIME)}[calls[0].function.name]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)
    return {"text": text, "required_call": {"name": calls[0].function.name,
                                            "arguments": json.loads(calls[0].function.arguments)}}


def run_responses(base, key, model, max_tokens):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    whole = client.responses.create(model=model, instructions=SYSTEM, input=USER, max_output_tokens=max_tokens,
                                    temperature=0)
    text = whole.output_text
    check(whole.status in ("completed", "incomplete"), f"responses status {whole.status}")
    deltas, final, kinds = [], None, []
    for event in client.responses.create(model=model, instructions=SYSTEM, input=USER,
                                         max_output_tokens=max_tokens, temperature=0, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    check("".join(deltas) == text, f"responses: streamed {''.join(deltas)!r} != {text!r}")
    check(final is not None and final.output_text == text, f"responses: final {final}")
    check(kinds[0] == "response.created", f"responses events {kinds}")

    tools = [{"type": "function", "name": WEATHER["name"], "description": WEATHER["description"],
              "parameters": WEATHER["schema"], "strict": True}]
    first = client.responses.create(model=model, input=TOOL_USER, tools=tools, tool_choice="required",
                                    max_output_tokens=max_tokens, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"responses: the forced call {first.output}")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["schema"])
    second = client.responses.create(model=model, previous_response_id=first.id, tools=tools,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": TOOL_RESULT}],
                                     max_output_tokens=max_tokens, temperature=0)
    check(second.previous_response_id == first.id, f"responses: previous_response_id {second.previous_response_id}")
    return {"text": text, "status": whole.status, "input_tokens": whole.usage.input_tokens,
            "output_tokens": whole.usage.output_tokens,
            "call": {"name": calls[0].name, "arguments": json.loads(calls[0].arguments)},
            "after_result_input_tokens": second.usage.input_tokens}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="charm-no-key")
    ap.add_argument("--max-tokens", type=int, default=24)
    a = ap.parse_args()
    base = a.base_url.rstrip("/")
    out = {
        "openai_version": openai.__version__,
        "anthropic_version": anthropic.__version__,
        "openai": run_openai(base, a.api_key, a.model, a.max_tokens),
        "anthropic": run_anthropic(base, a.api_key, a.model, a.max_tokens),
        "openai_tools": run_openai_tools(base, a.api_key, a.model, a.max_tokens),
        "anthropic_tools": run_anthropic_tools(base, a.api_key, a.model, a.max_tokens),
        "openai_structured": run_openai_structured(base, a.api_key, a.model, 48),
        "responses": run_responses(base, a.api_key, a.model, a.max_tokens),
    }
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
