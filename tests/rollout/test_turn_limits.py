"""``Environment.turn_limits``: an environment's stop strings and token cap for the
model's next turn, on top of the rollout's sampling (and of ``EnvStep.stop``)."""

from __future__ import annotations

from loomrl import Environment, EnvStep, SamplingParams, Status, rollout
from loomrl.envs import TurnLimits

REPLY = "alpha beta. gamma delta epsilon zeta eta theta"


class Limited(Environment):
    """Turn 1: no limits; turn 2: stop at "." (and the step's own stop "zeta"); turn 3:
    at most 2 tokens."""

    name = "limited"
    max_turns = 3

    def turn_limits(self, state):
        if state.turn == 1:
            return TurnLimits(stop=(".",))
        if state.turn == 2:
            return TurnLimits(max_tokens=2)
        return None

    def step(self, state, message):
        return EnvStep([{"role": "user", "content": "go on"}], done=False, stop=["zeta"])

    def score(self, state):
        return 0.0


async def test_each_turn_ends_where_its_limits_say(make_engine, check_contract, tokenizer):
    asked: list[SamplingParams] = []

    def reply(_prompt, params):
        asked.append(params)
        return REPLY

    engine = make_engine(reply)
    sampling = SamplingParams(max_tokens=32)
    (traj,) = await rollout(engine, Limited(), [{"question": "go"}], sampling=sampling)
    assert traj.status == Status.MAX_TURNS
    check_contract(traj)
    texts = [tokenizer.decode(traj.completion_ids[a:b]) for a, b in traj.spans]
    assert texts[0].startswith(REPLY)  # unlimited: the whole reply
    assert texts[1] == "alpha beta."  # "." (turn_limits) comes before "zeta" (the step's)
    assert len(traj.completion_ids[traj.spans[2][0] : traj.spans[2][1]]) == 2
    assert traj.finish_reasons == ["stop", "stop", "length"]
    assert asked[0].stop == () and asked[0].max_tokens == 32
    assert set(asked[1].stop) == {"zeta", "."} and asked[1].max_tokens == 32
    assert asked[2].stop == ("zeta",) and asked[2].max_tokens == 2
