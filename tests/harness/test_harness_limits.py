"""A harness request's ``stop`` and ``max_tokens`` apply to its turn, as in deployment: a
ReAct agent that stops on ``Observation:`` gets the text before it (the trajectory keeps
every sampled token), and a request's token cap ends the turn with ``length``."""

from __future__ import annotations

import httpx
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


async def react_agent(run, seen, stop=("Observation:",), **create):
    """Thought / Action, stop at ``Observation:``, run the action, report the result."""
    async with run.client() as client:
        messages = [{"role": "user", "content": run.example["question"]}]
        for _ in range(3):
            r = await client.chat.completions.create(
                model=run.model, messages=messages, stop=list(stop), **create
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


@pytest.mark.parametrize(("keep", "content"), [(False, THOUGHT), (True, THOUGHT + "Observ")])
async def test_a_stop_string_inside_a_token_keeps_the_whole_token_in_the_trajectory(
    engine, check_contract, tokenizer, keep, content
):
    """``Observ`` ends inside the sampled token ``ervation``: the answer stops before it
    (or, kept, right after it, as vLLM's server cuts); the trajectory holds that token."""
    seen: list = []
    extra = {"extra_body": {"include_stop_str_in_output": True}} if keep else {}
    env = HarnessEnv(lambda run: react_agent(run, seen, ("Observ",), **extra))
    (traj,) = await rollout(engine, env, [EXAMPLE], on_error="isolate", env_timeout=30)
    assert traj.status == Status.TERMINATED, traj.error
    check_contract(traj)
    assert seen[0].choices[0].message.content == content
    start, end = traj.spans[0]
    assert tokenizer.decode(traj.completion_ids[start:end]) == THOUGHT + "Observation"


# -- a ReAct agent over several steps -----------------------------------------------------------
ADD = "Thought: first the sum.\nAction: add 2 3"
MUL = "Thought: now the product.\nAction: mul 5 4"
DONE = "Thought: done\nFinal Answer: 20"
OPS = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b}


@pytest.fixture
def calculator(make_engine, tokenizer):
    """Each step invents its observation (and a wrong answer) unless the agent stops it."""

    def reply(prompt, _params):
        text = tokenizer.decode(prompt)
        if "user\nObservation: 20" in text:
            return DONE
        if "user\nObservation: 5" in text:
            return MUL + "\nObservation: 9\nFinal Answer: 9"
        return ADD + "\nObservation: 7\nThought: done\nFinal Answer: 28"

    return make_engine(reply)


async def calculator_agent(run, seen):
    """(2+3)*4 in steps: each answer's last ``Action:`` is run and its result sent back."""
    async with run.client() as client:
        messages = [{"role": "user", "content": "(2+3)*4?"}]
        for _ in range(4):
            r = await client.chat.completions.create(
                model=run.model,
                messages=messages,
                stop=["Observation:", "\nObservation"],
                logprobs=True,
            )
            seen.append(r)
            text = r.choices[0].message.content
            messages.append({"role": "assistant", "content": text})
            if "Final Answer:" in text:
                return float(text.rsplit("Final Answer:", 1)[1].strip() == "20")
            op, a, b = text.rsplit("Action:", 1)[1].split()
            messages.append({"role": "user", "content": f"Observation: {OPS[op](int(a), int(b))}"})
    return 0.0


async def test_a_react_agent_runs_its_actions_over_three_turns_token_exactly(
    calculator, check_contract, tokenizer
):
    seen: list = []
    env = HarnessEnv(lambda run: calculator_agent(run, seen))
    (traj,) = await rollout(calculator, env, [EXAMPLE], on_error="isolate", env_timeout=30)
    assert traj.status == Status.TERMINATED, traj.error
    check_contract(traj)
    assert [r.choices[0].message.content for r in seen] == [ADD, MUL, DONE]
    assert [r.choices[0].finish_reason for r in seen] == ["stop"] * 3
    assert traj.reward == 1.0 and traj.turns == 3 and not traj.segments
    # What the agent was told it got is what the trajectory trains on, token for token:
    # the stop string's tokens included, nothing of the invented observation after them.
    assert len(traj.spans) == 3
    for r, (start, end) in zip(seen, traj.spans, strict=True):
        told = r.choices[0].logprobs.content
        assert [int(t.token.removeprefix("token_id:")) for t in told] == (
            traj.completion_ids[start:end]
        )
        assert [t.logprob for t in told] == traj.logprobs[start:end]
        assert r.usage.completion_tokens == end - start
    texts = [tokenizer.decode(traj.completion_ids[a:b]) for a, b in traj.spans]
    assert texts[:2] == [ADD + "\nObservation", MUL + "\nObservation"]


async def test_asking_again_with_another_token_cap_is_a_new_turn_not_a_retry(
    engine, check_contract
):
    """A retry repeats its request; the same messages with another ``max_tokens`` ask for
    a new turn (the history is rewritten: a fork), as a deployment would answer anew."""
    seen: list = []

    async def agent(run):
        async with run.client() as client:
            messages = [{"role": "user", "content": "2+3?"}]
            for create in ({"max_tokens": 3}, {"max_tokens": 3}, {}):
                r = await client.chat.completions.create(
                    model=run.model, messages=messages, **create
                )
                seen.append(r)
        return 0.0

    (traj,) = await rollout(engine, HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    for segment in traj.all_segments():
        check_contract(segment)
    first, again, longer = seen
    assert again.id == first.id and first.choices[0].finish_reason == "length"
    assert longer.choices[0].message.content == HALLUCINATED
    assert traj.env_metrics["harness/resends"] == 1 and len(traj.segments) == 1


BAD = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": -5}, "max_completion_tokens"),
    ({"max_tokens": "64"}, "max_tokens"),
    ({"stop": ["Observation:", 7]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
]


async def test_bad_stop_or_token_caps_get_400s_naming_the_field(engine):
    """Each bad value is a 400 naming its field; nothing is sampled for it, and the agent's
    next good request is the episode's one turn."""
    answers: list[httpx.Response] = []

    async def agent(run):
        messages = [{"role": "user", "content": "2+3?"}]
        headers = {"Authorization": f"Bearer {run.api_key}"}
        async with httpx.AsyncClient(timeout=10, headers=headers) as http:
            for fields, _ in [*BAD, ({"stop": "Observation:", "max_tokens": 64}, None)]:
                body = {"model": run.model, "messages": messages, **fields}
                answers.append(await http.post(f"{run.base_url}/chat/completions", json=body))
        return 1.0

    (traj,) = await rollout(engine, HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    *refused, good = answers
    for response, (_, param) in zip(refused, BAD, strict=True):
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param
        assert param in error["message"] and error["type"] == "invalid_request_error"
    assert good.status_code == 200
    assert good.json()["choices"][0]["message"]["content"] == THOUGHT
    assert traj.turns == 1 and traj.env_metrics["harness/bad_requests"] == len(BAD)


async def test_a_requests_token_cap_is_bounded_by_the_context_left(engine, chat):
    """A cap larger than the room left in ``max_len`` samples what fits: the trajectory is
    truncated there (and the program, still waiting, is stopped)."""
    outcomes: list = []

    async def agent(run):
        async with run.client() as client:
            await client.chat.completions.create(
                model=run.model, messages=[{"role": "user", "content": "2+3?"}], max_tokens=50
            )
        return 1.0

    env = HarnessEnv(agent, reward=lambda outcome: outcomes.append(outcome) or 0.0)
    prompt = chat.prompt_ids([{"role": "user", "content": "2+3?"}], None)
    (traj,) = await rollout(
        engine, env, [EXAMPLE], max_len=len(prompt) + 6, on_error="isolate", env_timeout=30
    )
    assert traj.status == Status.TRUNCATED, traj.error
    assert traj.spans == [(0, 6)] and traj.finish_reasons == ["length"]
    assert [o.finished for o in outcomes] == [False]
