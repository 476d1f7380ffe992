"""``ToolEnv(parser="auto")``, the default: the tool-call parser follows the chat template
the rollout gives the environment, a named parser stays as named, and the choice is in
the environment's run info. The acceptance: the default model's tokenizer under Mistral
v0.3's, gpt-oss's, Qwen3's and Llama 3.1's templates in the ``calculator`` env, with no
parser named, plays the replies such a model writes without any episode ending in a
template error (a Hermes parser fixed in advance ends one in Mistral's own error)."""

from __future__ import annotations

import copy

import pytest
from families import EXAMPLE, FAMILIES, Calculator, check_episode, family_tokenizer, replies

import loomrl
from loomrl.engines import ScriptedEngine
from loomrl.envs.calculator import CalculatorEnv
from loomrl.envs.scored import RubricEnv
from loomrl.parsers import HermesParser, MistralParser
from loomrl.rewards.rubric import Rubric
from loomrl.types import Status

# Family (tests/families.py; `hermes` is Qwen3's template) -> the parser it calls for.
TEMPLATES = {
    "mistral": "mistral",
    "gpt_oss": "harmony",
    "hermes": "hermes",
    "llama3_1": "llama3_json",
}
MISTRAL = FAMILIES["mistral"].template.read_text()
QUESTION = "What is 12 * 3 + 4?"
HERMES_CALL = (
    '<tool_call>\n{"name": "calculate", "arguments": {"expression": "12 * 3"}}\n</tool_call>'
)


def test_auto_is_the_default_and_reads_hermes_until_a_template_is_known():
    env = CalculatorEnv()
    assert env.auto_parser and env.parser_name == "hermes"
    assert isinstance(env.parser, HermesParser)
    assert env.run_info() == {"parser": "hermes"}


def test_the_template_chooses_the_parser_and_a_named_one_stays():
    env = CalculatorEnv()
    env.use_chat_template(MISTRAL)
    assert env.parser_name == "mistral" and isinstance(env.parser, MistralParser)
    assert env.run_info() == {"parser": "mistral"}
    assert "[TOOL_CALLS]" in env.reset({"question": QUESTION}).messages[0]["content"]
    named = CalculatorEnv(parser="hermes")
    named.use_chat_template(MISTRAL)
    assert named.parser_name == "hermes" and not named.auto_parser


@pytest.mark.parametrize("parser", ["nope", "AUTO"])
def test_an_unknown_parser_is_refused_naming_auto_among_the_choices(parser):
    with pytest.raises(ValueError) as info:
        CalculatorEnv(parser=parser)
    assert str(info.value) == (
        f"unknown tool-call parser {parser!r}; known: deepseek_v3, glm45, harmony, hermes, "
        "llama3_json, mistral, qwen3_coder, or 'auto' (the format the model's chat template "
        "renders, the default)"
    )


def test_a_rubric_env_hands_the_template_to_the_env_it_wraps():
    inner = CalculatorEnv()
    wrapped = RubricEnv(inner, Rubric({"one": lambda sample: 1.0}))
    wrapped.use_chat_template(MISTRAL)
    assert inner.parser_name == "mistral" and wrapped.run_info() == {"parser": "mistral"}


MISTRAL_CALL = '[TOOL_CALLS] [{"name": "calculate", "arguments": {"expression": "12 * 3"}}]'
# What the default model writes as its first turn, one per episode: a Hermes call (the
# format it was tuned on), a Mistral call (as the Mistral template's instructions ask),
# and an answer without a call.
FIRST_TURNS = {"hermes-call": HERMES_CALL, "mistral-call": MISTRAL_CALL, "answer": "Answer: 40"}


async def play(tokenizer, name: str, **env_args):
    """One episode per first turn in the calculator, under ``name``'s template swapped
    into the default tokenizer (as on a copy of the model directory); every later turn
    answers once the tool's result is in the prompt."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = FAMILIES[name].template.read_text()

    def reply(ids, params):
        prompt = tok.decode(ids)
        case = next(c for c in FIRST_TURNS if f"case {c}" in prompt)
        after = prompt.rsplit(f"case {case}", 1)[1]
        return "Answer: 40" if "36" in after else FIRST_TURNS[case]

    engine = ScriptedEngine(reply, tokenizer=tok)
    env = CalculatorEnv(**env_args)
    examples = [
        {"id": i, "question": f"{QUESTION} (case {c})", "answer": 40}
        for i, c in enumerate(FIRST_TURNS)
    ]
    try:
        trajs = await loomrl.rollout(engine, env, examples, on_error="isolate", max_turns=3)
    finally:
        await engine.close()
    return env, dict(zip(FIRST_TURNS, trajs, strict=True))


@pytest.mark.parametrize("name", sorted(TEMPLATES))
async def test_no_episode_ends_in_a_template_error_with_no_parser_named(tokenizer, name):
    env, trajs = await play(tokenizer, name)
    assert env.parser_name == TEMPLATES[name]
    for case, traj in trajs.items():
        assert traj.status == Status.TERMINATED and traj.error is None, (case, traj.error)
    # Under Mistral's template its own call is read, answered and the answer scored.
    mistral = trajs["mistral-call"]
    assert mistral.env_metrics["tool_calls"] == (1 if name == "mistral" else 0)
    assert mistral.reward == (1.0 if name == "mistral" else 0.0)


async def test_a_hermes_parser_fixed_in_advance_breaks_mistrals_template(tokenizer):
    """What ``auto`` prevents: the Hermes reading of a call gives it an id Mistral's
    template refuses, and the episode ends in the template's own error."""
    _, trajs = await play(tokenizer, "mistral", parser="hermes")
    broken = trajs["hermes-call"]
    assert broken.status == Status.ERROR
    assert "Tool call IDs should be alphanumeric strings with length 9!" in broken.error
    assert [c for c, t in trajs.items() if t.status == Status.ERROR] == ["hermes-call"]


@pytest.mark.filterwarnings("ignore::loomrl.tokens.TemplateWarning")
@pytest.mark.parametrize("name", sorted(FAMILIES))
async def test_each_familys_own_calls_are_read_with_no_parser_named(make_engine, tokenizer, name):
    """A model of each family (the default tokenizer given the family's markers, as in
    ``tests/rollout/test_tool_call_families.py``) plays the 3-turn calculator episode
    its template renders, with the parser chosen from that template: token-exact, both
    calls read as structure, their results answered."""
    family = FAMILIES[name]
    tok = family_tokenizer(tokenizer, family)
    chat = family.chat(tok)
    texts, prompts = replies(tok, family), []

    def reply(prompt_ids, params):
        prompts.append(list(prompt_ids))
        return chat.encode(texts[len(prompts) - 1])

    env = Calculator(tools_in_prompt=False) if family.no_system else CalculatorEnv()
    stops = tuple(tok.convert_tokens_to_ids(list(family.stops)))
    sampling = loomrl.SamplingParams(max_tokens=200, stop_token_ids=stops)
    engine = make_engine(reply, tokenizer=tok)
    (traj,) = await loomrl.rollout(engine, env, [EXAMPLE], chat=chat, sampling=sampling)
    assert env.parser_name == family.parser
    check_episode(tok, family, chat, traj, prompts, name)
