#!/usr/bin/env python3
"""The OpenAI Agents SDK, unmodified, runs a two-tool loop against a charm
server: only the base URL changes.

The agent has two tools whose arguments are closed sets (Literal types, so
their JSON schemas are enums). Its first turn must call `get_time`, its
second `get_weather` (tool_choice named each time, switched by a run hook
when a tool ends), its third must answer in text (tool_choice none). Each
call is grammar-forced on the server, so the SDK gets arguments it can
parse and validate; each tool result goes back to the model. The loop runs
once over the Responses API (the SDK's default) and once over Chat
Completions.

Prints one JSON object: per API, the calls the tools received and the final
text.

Usage: python scripts/test_agents.py --base-url http://127.0.0.1:PORT --model ID
Needs: scripts/sdk_venv.sh (openai-agents pinned there).
"""

import argparse
import asyncio
import json
import sys
from typing import Literal

import agents
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunHooks, Runner,
                    function_tool, set_tracing_disabled)
from openai import AsyncOpenAI


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def make_agent(model, calls):
    @function_tool
    def get_time(city: Literal["Paris", "Lagos", "Lima"]) -> str:
        """The local time in a city."""
        calls.append({"tool": "get_time", "city": city})
        return "14:05"

    @function_tool
    def get_weather(city: Literal["Paris", "Lagos", "Lima"], unit: Literal["celsius", "fahrenheit"]) -> str:
        """The current weather in a city."""
        calls.append({"tool": "get_weather", "city": city, "unit": unit})
        return "18 degrees, clear"

    return Agent(
        name="assistant",
        instructions="Answer with the help of the tools: the time first, then the weather.",
        tools=[get_time, get_weather],
        model=model,
        model_settings=ModelSettings(tool_choice="get_time", temperature=0, max_tokens=48),
        reset_tool_choice=False,
    )


class Switch(RunHooks):
    """After get_time, force get_weather; after that, force a text answer."""

    async def on_tool_end(self, context, agent, tool, result):
        nxt = {"get_time": "get_weather", "get_weather": "none"}[tool.name]
        agent.model_settings = agent.model_settings.resolve(ModelSettings(tool_choice=nxt))


async def run(model, name):
    calls = []
    agent = make_agent(model, calls)
    result = await Runner.run(agent, "What time is it in Paris, and what is the weather there?",
                              max_turns=5, hooks=Switch())
    check([c["tool"] for c in calls] == ["get_time", "get_weather"], f"{name}: the tools ran in order: {calls}")
    check(isinstance(result.final_output, str), f"{name}: a text answer at the end: {result.final_output!r}")
    return {"calls": calls, "final_output": result.final_output, "turns": len(result.raw_responses)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="charm-no-key")
    a = ap.parse_args()
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=a.base_url.rstrip("/") + "/v1", api_key=a.api_key, max_retries=0, timeout=300)
    out = {"agents_version": agents.__version__ if hasattr(agents, "__version__") else "?"}

    async def both():
        out["responses"] = await run(OpenAIResponsesModel(model=a.model, openai_client=client), "responses")
        out["chat_completions"] = await run(OpenAIChatCompletionsModel(model=a.model, openai_client=client),
                                            "chat_completions")
        await client.close()

    asyncio.run(both())
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
