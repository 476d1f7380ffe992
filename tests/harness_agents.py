"""Agent harnesses written with the official ``openai`` client, for the harness tests:
a tool loop, and one that compacts its history (a fork). Importable by name
(``harness_agents:tool_agent``) for ``loomrl train`` runs in a subprocess."""

from __future__ import annotations

import json
import random
from typing import Any

from loomrl.harness import HarnessOutcome, HarnessRun

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
SYSTEM = "You are a careful assistant. Use the add tool for sums."


def examples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        out.append({"id": i, "question": f"What is {a} + {b}?", "answer": a + b})
    return out


def reward(outcome: HarnessOutcome) -> float:
    """1 when the model's last answer holds the sum."""
    answers = [m["content"] for m in outcome.messages if m["role"] == "assistant"]
    return float(bool(answers) and str(outcome.example["answer"]) in answers[-1])


def _add(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) + int(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"Error: {exc}"


async def tool_agent(run: HarnessRun, rounds: int = 3) -> dict[str, Any]:
    """Ask, run every tool call, and nudge the model once more when it answers without
    one: ``rounds`` requests at most."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": run.example["question"]},
    ]
    async with run.client() as client:
        for _ in range(rounds):
            reply = await client.chat.completions.create(
                model=run.model, messages=messages, tools=[ADD], temperature=0.7, max_tokens=64
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if message.tool_calls:
                for call in message.tool_calls:
                    result = _add(call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            else:
                messages.append({"role": "user", "content": "Check it with the add tool."})
    return {"requests": rounds}


async def two_requests(run: HarnessRun) -> dict[str, float]:
    """Asks, says "Go on.", and reports whether the last answer held the sum."""
    async with run.client() as client:
        messages = await _two_turns(client, run, run.example["question"])
    return {"reward": float(str(run.example["answer"]) in messages[-1]["content"])}


async def compacting_agent(run: HarnessRun) -> None:
    """Two requests in one conversation, then a third that replaces the history with a
    summary (as agent frameworks compact a long context): the episode forks."""
    question = run.example["question"]
    async with run.client() as client:
        messages = await _two_turns(client, run, question)
        summary = (messages[-1]["content"] or "")[:120]
        compacted = [
            {"role": "system", "content": "Earlier work was summarised."},
            {"role": "user", "content": f"{question} Notes so far: {summary!r}. Final answer?"},
        ]
        await client.chat.completions.create(model=run.model, messages=compacted)


async def _two_turns(client: Any, run: HarnessRun, question: str) -> list[dict[str, Any]]:
    """Ask ``question``, then "Go on.": the conversation with both answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for follow_up in ("Go on.", None):
        reply = await client.chat.completions.create(model=run.model, messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return messages
