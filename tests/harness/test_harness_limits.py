"""A harness request's ``stop`` and ``max_tokens`` apply to its turn, as in deployment: a
ReAct agent that stops on ``Observation:`` gets the text before it (the trajectory keeps
every sampled token), and a request's token cap ends the turn with ``length``."""

from __future__ import annotations

import pytest

from loomrl import SamplingParams, Status, rollout
from loomrl.harness import HarnessEnv

THOUGHT = "Thought: I add.\nAction: add 2 3\n"
HALLUCINATED = THOUGHT + "Observation: 7\nThought: done\nFinal Answer: 7"
FINAL = "Thought: done\nFinal Answer: 5"
EXAMPLE = {"id": 0, "question": "2+3?"}


@pytest.fixture
def engine(make_engine, tokenizer):
    """A ReAct model that writes its own observation unless the agent stops it; once the
    real observation is in its context, it answers."""

    def reply(prompt, _params):
        text = tokenizer.decode(prompt)
        return FINAL if "<|im_start|>user\nObservation: 5" in text else HALLUCINATED

    return make_engine(reply)


async def react_agent(run, seen, **create):
    """Thought / Action, stop at ``Observation:``, run the action, report the result."""
    async with run.client() as client:
        messages = [{"role": "user", "content": run.example["question"]}]
        for _ in range(3):
            r = await client.chat.completions.create(
                model=run.model, messages=messages, stop=["Observation:"], **create
            )
            seen.append(r)
            text = r.choices[0].message.content
            messages.append({"role": "assistant", "content": text})
            if "Final Answer:" in text:
                return float(text.rsplit("Final Answer:", 1)[1].strip() == "5")
            messages.append({"role": "user", "content": "Observation: 5"})
    return 0.0


async def test_a_react_agent_stops_on_observation_and_the_trajectory_stays_exact(
    engine, check_contract
):
    seen: list = []
    env = HarnessEnv(lambda run: react_agent(run, seen))
    (traj,) = await rollout(engine, env, [EXAMPLE], on_error="isolate", env_timeout=30)
    assert traj.status == Status.TERMINATED, traj.error
    check_contract(traj)
    # Stopped: the agent saw the text before the stop string, ran the action, and the
    # model answered from the real observation (unstopped, it would have said 7).
    assert [r.choices[0].message.content for r in seen] == [THOUGHT, FINAL]
    assert [r.choices[0].finish_reason for r in seen] == ["stop", "stop"]
    assert traj.reward == 1.0 and traj.turns == 2
    assert traj.env_metrics["harness/prefix_match_rate"] == 1.0  # no fork: exact extension
    # The trajectory keeps what was sampled: the first turn ends with the stop string.
    first = traj.messages[1]
    assert first["role"] == "assistant" and first["content"].startswith(THOUGHT)
    assert first["content"].rstrip().endswith("Observation:")
    assert "7" not in first["content"]


async def test_include_stop_str_in_output_keeps_the_stop_string(engine):
    seen: list = []
    env = HarnessEnv(
        lambda run: react_agent(run, seen, extra_body={"include_stop_str_in_output": True})
    )
    (traj,) = await rollout(engine, env, [EXAMPLE], on_error="isolate", env_timeout=30)
    assert traj.status == Status.TERMINATED, traj.error
    assert seen[0].choices[0].message.content.rstrip().endswith("Observation:")


async def test_without_stop_the_model_runs_past_its_action(engine):
    """The control: the same agent without ``stop`` gets the hallucinated observation."""
    seen: list = []

    async def agent(run):
        async with run.client() as client:
            seen.append(
                await client.chat.completions.create(
                    model=run.model, messages=[{"role": "user", "content": "2+3?"}]
                )
            )
        return 0.0

    await rollout(engine, HarnessEnv(agent), [EXAMPLE], on_error="isolate", env_timeout=30)
    assert seen[0].choices[0].message.content == HALLUCINATED


@pytest.mark.parametrize(
    ("create", "rollout_max", "expected"),
    [
        ({"max_tokens": 3}, 64, 3),
        ({"max_completion_tokens": 2, "max_tokens": 5}, 64, 2),  # the newer name wins
        ({"max_tokens": 50}, 4, 4),  # the rollout's max_tokens still bounds the turn
    ],
)
async def test_a_requests_token_cap_ends_its_turn_with_length(
    engine, check_contract, create, rollout_max, expected
):
    seen: list = []

    async def agent(run):
        async with run.client() as client:
            messages = [{"role": "user", "content": "2+3?"}]
            first = await client.chat.completions.create(
                model=run.model, messages=messages, **create
            )
            messages += [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Observation: 5"},
            ]
            second = await client.chat.completions.create(model=run.model, messages=messages)
            seen.extend([first, second])
        return 0.0

    sampling = SamplingParams(max_tokens=rollout_max)
    (traj,) = await rollout(
        engine, HarnessEnv(agent), [EXAMPLE], sampling=sampling, on_error="isolate"
    )
    assert traj.status == Status.TERMINATED, traj.error
    check_contract(traj)
    first, second = seen
    assert first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == expected == traj.spans[0][1] - traj.spans[0][0]
    # The cap was that request's: the next turn (no cap) runs to its end.
    if rollout_max > 4:
        assert second.choices[0].message.content == FINAL
        assert second.choices[0].finish_reason == "stop"
