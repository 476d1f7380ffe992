"""Observation budgets: an over-long env message is cut in the middle with a marker (per
message by ``max_obs_tokens``, and to fit ``max_len``), the trajectory stays token-exact
and its messages say what the tokens encode; the episode goes on."""

from __future__ import annotations

import pytest

from loomrl import Environment, EnvStep, Status, rollout
from loomrl.episode.observations import cap_messages, cut_middle, fit_messages

WORDS = " ".join(f"w{i}" for i in range(2000))  # ~4000 tokens, head and tail distinct


class Verbose(Environment):
    """Answers every turn with a long tool-like output; ends after ``turns`` turns."""

    name = "verbose"
    max_turns = 3

    def __init__(self, text: str = WORDS, turns: int = 2, budget: int | None = None) -> None:
        self.text, self.turns = text, turns
        self.max_obs_tokens = budget
        self.seen: list[str] = []

    def step(self, state, message):
        self.seen.append(message["content"])
        if state.turn >= self.turns:
            return EnvStep([{"role": "user", "content": "closing " + self.text}], done=True)
        return EnvStep([{"role": "user", "content": self.text}], done=False)

    def score(self, state):
        return 1.0


def test_cut_middle_keeps_head_and_tail_and_counts_the_cut(chat):
    ids = chat.encode(WORDS)
    text, cut = cut_middle(chat, WORDS, 100)
    assert cut == len(ids) - 100
    assert text.startswith("w0 w1 w2") and text.endswith("w1998 w1999")
    assert f"[... {cut} tokens cut ...]" in text
    assert len(chat.encode(text)) <= 100 + len(chat.encode(f"\n[... {cut} tokens cut ...]\n")) + 2
    assert cut_middle(chat, "short", 100) == ("short", 0)


def test_cap_messages_leaves_short_and_non_text_messages_alone(chat):
    messages = [
        {"role": "tool", "name": "t", "content": WORDS},
        {"role": "tool", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "parts"}]},
    ]
    capped, cut = cap_messages(chat, messages, 50)
    assert cut > 3000 and capped[0]["name"] == "t" and "tokens cut" in capped[0]["content"]
    assert capped[1:] == messages[1:]
    assert messages[0]["content"] == WORDS  # the input is not modified
    assert cap_messages(chat, messages, None) == (messages, 0)


def test_fit_messages_gives_up_below_the_minimum(chat):
    def glue_of(ms):
        return chat.glue_ids(list(ms), ended_with_eot=True)

    messages = [{"role": "user", "content": WORDS}]
    fitted = fit_messages(chat, messages, glue_of, room=300, reserve=50)
    assert fitted is not None
    replies, glue, cut = fitted
    assert len(glue) + 50 <= 300 and cut > 3000
    assert "tokens cut ...]" in replies[0]["content"]
    assert fit_messages(chat, messages, glue_of, room=20, reserve=10) is None


async def test_max_obs_tokens_cuts_each_env_message(make_engine, tokenizer, check_contract):
    env = Verbose(budget=64)
    (traj,) = await rollout(make_engine(lambda ids, p: "run it"), env, [{"question": "Q0"}])
    assert traj.status == Status.TERMINATED and traj.turns == 2
    env_message = traj.messages[2]
    assert env_message["role"] == "user" and "tokens cut ...]" in env_message["content"]
    assert env_message["content"].startswith("w0 w1") and env_message["content"].endswith("w1999")
    assert traj.num_env_tokens < 150  # the 4000-token output did not enter the trajectory
    assert traj.env_metrics["obs_tokens_cut"] > 3000
    check_contract(traj)


async def test_env_message_past_max_len_is_cut_not_the_episode(make_engine, chat, check_contract):
    env = Verbose()  # no per-message cap: only max_len applies
    prompt = len(chat.prompt_ids([{"role": "user", "content": "Q0"}]))
    max_len = prompt + 400
    engine = make_engine(lambda ids, p: "run it")
    (traj,) = await rollout(engine, env, [{"question": "Q0"}], max_len=max_len)
    assert traj.turns == 2 and traj.status == Status.TERMINATED  # the episode went on
    assert len(traj.prompt_ids) + len(traj.completion_ids) <= max_len
    assert "tokens cut ...]" in traj.messages[2]["content"]
    check_contract(traj)


async def test_without_room_even_for_a_cut_observation_the_episode_truncates(
    make_engine, chat, tokenizer
):
    env = Verbose()
    prompt = len(chat.prompt_ids([{"role": "user", "content": "Q0"}]))
    turn = len(tokenizer.encode("run it", add_special_tokens=False)) + 1
    (traj,) = await rollout(
        make_engine(lambda ids, p: "run it"), env, [{"question": "Q0"}], max_len=prompt + turn + 20
    )
    assert traj.status == Status.TRUNCATED and traj.turns == 1
    assert len(traj.completion_ids) == turn  # no glue was appended


async def test_closing_messages_are_never_cut(make_engine):
    env = Verbose(turns=1, budget=8)
    (traj,) = await rollout(make_engine(lambda ids, p: "done"), env, [{"question": "Q0"}])
    assert traj.status == Status.TERMINATED and "obs_tokens_cut" not in traj.env_metrics


@pytest.mark.parametrize("budget", [0, -3, 2.5, True])
async def test_invalid_budget_is_refused_before_generating(make_engine, budget):
    env = Verbose(budget=budget)
    with pytest.raises(ValueError, match="max_obs_tokens must be a positive integer"):
        await rollout(make_engine(lambda ids, p: "x"), env, [{"question": "Q0"}])


def test_cap_messages_cuts_the_text_of_a_message_with_images(chat):
    """max_obs_tokens applies to an observation that shows an image too (a screenshot and
    its long text): the text parts share the budget, the image part is kept as it is."""
    image = {"type": "image", "image": "sha256:" + "0" * 64}
    message = {
        "role": "user",
        "content": [image, {"type": "text", "text": WORDS}, {"type": "text", "text": "ok"}],
    }
    (capped,), cut = cap_messages(chat, [message], 50)
    parts = capped["content"]
    assert cut > 3000 and parts[0] is image and parts[2] == {"type": "text", "text": "ok"}
    assert "tokens cut" in parts[1]["text"] and parts[1]["text"].startswith("w0 w1")
    assert message["content"][1]["text"] == WORDS  # the input is not modified
