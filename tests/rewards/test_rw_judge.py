"""Judge through a ScriptedEngine with canned judge replies."""

from __future__ import annotations

import pytest

from loomrl.rewards import Judge, JudgeParseError, Recipe, RewardSample, RewardSource
from loomrl.rewards.judge import parse_score
from loomrl.types import SamplingParams


def sample(completion: str, answer: str = "4") -> RewardSample:
    return RewardSample(prompt="What is 2 + 2?", completion=completion, example={"answer": answer})


def canned(replies: dict[str, str], tokenizer):
    """A judge engine's reply function: the reply for the first key found in the prompt."""
    prompts: list[str] = []

    def reply(prompt_ids, _params):
        text = tokenizer.decode(list(prompt_ids))
        prompts.append(text)
        return next(r for key, r in replies.items() if f"Response:\n{key}\n" in text)

    reply.prompts = prompts
    return reply


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("Good.\nScore: 7", 7.0),
        ("Score: 7.5.", 7.5),
        ("  score :10  ", 10.0),
        ("Fine\nSCORE: 0\nthanks", 0.0),
        ("Score: .5", 0.5),
    ],
)
def test_parse_score_accepts_one_plain_score_line(reply, value):
    assert parse_score(reply, 0, 10) == value


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("I like it a lot. 9/10", r"no 'Score: <number>' line"),
        ("Score: 7/10", r"the Score line holds '7/10', not a plain number"),
        ("Score: seven", r"the Score line holds 'seven', not a plain number"),
        ("**Score:** 8", r"no 'Score: <number>' line"),
        ("Score: 3\nScore: 4", r"2 'Score:' lines, expected exactly one"),
        ("Score: 11", r"score 11 is outside \[0, 10\]"),
        ("Score: -1", r"score -1 is outside \[0, 10\]"),
        ("Score: ", r"the Score line holds '', not a plain number"),
    ],
)
def test_parse_score_rejects_everything_else(reply, problem):
    with pytest.raises(ValueError, match=problem):
        parse_score(reply, 0, 10)


async def test_judge_scores_normalised_and_sees_prompt_completion_and_reference(
    make_engine, chat, tokenizer
):
    reply = canned({"4": "Correct.\nScore: 10", "5": "Wrong.\nScore: 2"}, tokenizer)
    judge = Judge(make_engine(reply), chat, system="You are a strict grader.")
    assert isinstance(judge, RewardSource)
    assert await judge([sample("4"), sample("5")]) == [1.0, 0.2]
    prompt = reply.prompts[0]
    assert "You are a strict grader." in prompt
    assert "Question:\nWhat is 2 + 2?" in prompt and "Reference answer (may be empty):\n4" in prompt
    assert '"Score: N", where N is a number from 0 to 10' in prompt
    verdicts = await judge.judge_many([sample("5")])
    assert verdicts[0].ok and verdicts[0].raw_score == 2.0 and verdicts[0].score == 0.2
    assert verdicts[0].reply == "Wrong.\nScore: 2"


async def test_raw_scale_and_custom_template(make_engine, chat, tokenizer):
    template = "Q: {prompt}\nResponse:\n{completion}\nRate {low}..{high}. Literal {{braces}}."
    reply = canned({"4": "Score: 4"}, tokenizer)
    judge = Judge(make_engine(reply), chat, template=template, low=1, high=5, normalize=False)
    assert judge.prompt(sample("4")).endswith("Rate 1..5. Literal {braces}.")
    assert await judge([sample("4")]) == [4.0]


async def test_parse_failures_raise_by_default(make_engine, chat, tokenizer):
    judge = Judge(make_engine(canned({"4": "Looks right to me: 9/10"}, tokenizer)), chat)
    with pytest.raises(
        JudgeParseError,
        match=r"judge reply unusable: no 'Score: <number>' line; "
        r"reply: 'Looks right to me: 9/10'",
    ):
        await judge([sample("4")])


async def test_fallback_policy_scores_and_flags_failures(make_engine, chat, tokenizer):
    replies = {"4": "Score: 8", "5": "Score: 12", "6": "no idea"}
    judge = Judge(
        make_engine(canned(replies, tokenizer)), chat, on_parse_error="fallback", fallback=-1.0
    )
    assert await judge([sample("4"), sample("5"), sample("6")]) == [0.8, -1.0, -1.0]
    assert judge.parse_failures == 2
    (verdict,) = await judge.judge_many([sample("5")])
    assert not verdict.ok and verdict.score is None and verdict.raw_score is None
    assert verdict.error == "score 12 is outside [0, 10]"
    assert judge.parse_failures == 3


async def test_a_reply_cut_at_max_tokens_says_so(make_engine, chat, tokenizer):
    judge = Judge(
        make_engine(canned({"4": "Let me think about this very carefully. Score: 9"}, tokenizer)),
        chat,
        sampling=SamplingParams(max_tokens=3, temperature=0.0),
    )
    with pytest.raises(JudgeParseError, match=r"no 'Score: <number>' line \(cut at max_tokens\)"):
        await judge([sample("4")])


async def test_a_recipe_only_asks_the_judge_about_its_label(make_engine, chat, tokenizer):
    reply = canned({"hello there": "Score: 5"}, tokenizer)
    engine = make_engine(reply)
    recipe = Recipe(
        {"chat": [("judge", 1.0)], "math": [("exact", 1.0)]},
        sources={"judge": Judge(engine, chat)},
    )
    chat_sample = RewardSample("Say hi", "hello there", label="chat")
    math_sample = RewardSample("2+2?", "Answer: 4", {"answer": 4}, label="math")
    results = await recipe.score_many([math_sample, chat_sample, math_sample])
    assert [r.total for r in results] == [1.0, 0.5, 1.0]
    assert engine.requests_served == 1 and len(reply.prompts) == 1


def test_construction_errors_are_precise(make_engine, chat):
    engine = make_engine()
    with pytest.raises(
        ValueError,
        match=r"unknown field\(s\) \['reply'\]; available: "
        r"answer, completion, high, low, prompt, question, reference",
    ):
        Judge(engine, chat, template="{completion} vs {reply}")
    with pytest.raises(ValueError, match=r"never shows the \{answer\}"):
        Judge(engine, chat, template="{prompt}")
    with pytest.raises(ValueError, match=r"invalid judge template: .*double literal braces"):
        Judge(engine, chat, template="{completion} {oops")
    with pytest.raises(ValueError, match="need low < high, got low=5, high=5"):
        Judge(engine, chat, low=5, high=5)
    with pytest.raises(ValueError, match="on_parse_error must be 'raise' or 'fallback'"):
        Judge(engine, chat, on_parse_error="ignore")
