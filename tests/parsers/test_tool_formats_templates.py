"""Each tool-call parser reads back exactly the calls its model family's real chat
template renders (tests/fixtures/chat_templates/, each naming its source).

An assistant turn with OpenAI-style ``tool_calls`` is rendered with the template; the
text after the generation prompt, less the end-of-turn marker (what the model generates
and the turn loop hands the environment), must parse to the same names and typed
arguments. GLM-4.5's and DeepSeek-V3's formats are rendered by the test templates in
tests/data/, which write those formats (no published template file is kept here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomrl import parsers
from loomrl.parsers import ToolCall

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"
DATA = Path(__file__).parents[1] / "data"

# template file -> (parser name, text that ends the assistant turn, calls per turn)
FAMILIES = {
    "qwen3_coder": ("qwen3_coder", "<|im_end|>\n", None),
    "qwen3_5": ("qwen3_coder", "<|im_end|>\n", None),
    "llama3_1": ("llama3_json", "<|eot_id|>", 1),
    "llama3_2": ("llama3_json", "<|eot_id|>", 1),
    "mistral": ("mistral", "EOS", None),
    "mistral_args": ("mistral", "EOS", None),
    "gpt_oss": ("harmony", "<|call|>", 1),
    "glm4moe": ("glm45", "", None),
    "deepseek_v3": ("deepseek_v3", "<｜end▁of▁sentence｜>", None),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name."},
                "days": {"type": "integer"},
                "threshold": {"type": "number"},
                "metric": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "options": {"type": "object"},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "unit": {"type": "string", "enum": ["C", "F"]},
            },
            "required": ["city"],
        },
    },
}
RUN = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": "Run Python code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["code"],
        },
    },
}
TOOLS = [WEATHER, RUN]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def template(family: str) -> str:
    path = TEMPLATES / f"{family}.jinja"
    return (path if path.exists() else DATA / f"{family}_chat_template.jinja").read_text()


def generated(tokenizer, family: str, calls: list[ToolCall], content: str = "") -> str:
    """The assistant turn's text as the model writes it, rendered by the real template."""
    chat_template = template(family)
    tool_calls = [
        {
            "id": f"call{i:05d}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for i, c in enumerate(calls, start=1)
    ]
    turn = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    kwargs = {"tools": TOOLS, "chat_template": chat_template, "tokenize": False}
    prompt = tokenizer.apply_chat_template(USER, add_generation_prompt=True, **kwargs)
    full = tokenizer.apply_chat_template([*USER, turn], **kwargs)
    assert full.startswith(prompt), f"{family}: the turn does not extend the prompt"
    text = full[len(prompt) :]
    end = FAMILIES[family][1].replace("EOS", tokenizer.eos_token)
    assert text.endswith(end), f"{family}: {text[-40:]!r} does not end with {end!r}"
    return text[: len(text) - len(end)]


def parse(family: str, text: str):
    return parsers.get(FAMILIES[family][0]).parse(text, tools=TOOLS)


SAMPLE = [
    ToolCall(
        "get_weather",
        {
            "city": "São Paulo",
            "days": 3,
            "threshold": -2.5,
            "metric": True,
            "tags": ["rain", "wind"],
            "options": {"hourly": False, "lang": "pt"},
            "note": None,
            "unit": "C",
        },
    ),
    ToolCall("run_python", {"code": "for i in range(3):\n    print(i)\n", "timeout": 10}),
    ToolCall("get_weather", {"city": "42"}),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_rendered_calls_parse_back_exactly(tokenizer, family):
    per_turn = FAMILIES[family][2] or len(SAMPLE)
    for start in range(0, len(SAMPLE), per_turn):
        calls = SAMPLE[start : start + per_turn]
        text = generated(tokenizer, family, calls)
        assert parse(family, text) == calls, text
        for got in parse(family, text):  # types, not only equal values (True == 1)
            want = next(c for c in calls if c.arguments == got.arguments)
            for key, value in got.arguments.items():
                assert type(value) is type(want.arguments[key]), (family, key, value)


@pytest.mark.parametrize("family", FAMILIES)
def test_calls_after_prose_or_analysis_are_read(tokenizer, family):
    call = ToolCall("get_weather", {"city": "Paris", "days": 2})
    text = generated(tokenizer, family, [call], content="Let me look that up.")
    assert parse(family, text) == [call]


# Strings without the formats' own markers ("<" opens Qwen and Harmony tags, "[" Mistral's).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="<["), max_size=30)
WEATHER_ARGS = st.fixed_dictionaries(
    {"city": TEXT},
    optional={
        "days": st.integers(-(10**12), 10**12),
        "threshold": st.floats(allow_nan=False, allow_infinity=False, width=32),
        "metric": st.booleans(),
        "tags": st.lists(TEXT, max_size=3),
        "options": st.dictionaries(TEXT, st.integers() | st.booleans() | TEXT, max_size=3),
        # A nullable string spelt "null" or "None" reads as null in the XML format (its
        # values are untyped text): the one ambiguity of that format, documented.
        "note": st.none() | TEXT.filter(lambda t: t.strip() not in ("null", "None")),
        "unit": st.sampled_from(["C", "F"]),
    },
)


@pytest.mark.parametrize("family", FAMILIES)
def test_random_arguments_round_trip(tokenizer, family):
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(WEATHER_ARGS, min_size=1, max_size=FAMILIES[family][2] or 3))
    def round_trip(many):
        calls = [ToolCall("get_weather", args) for args in many]
        assert parse(family, generated(tokenizer, family, calls)) == calls

    round_trip()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_template_renders_the_parsers_instructions(tokenizer, family):
    instructions = parsers.get(FAMILIES[family][0]).instructions(TOOLS)
    messages = [{"role": "system", "content": instructions}, *USER]
    text = tokenizer.apply_chat_template(
        messages, chat_template=template(family), tokenize=False, add_generation_prompt=True
    )
    assert instructions.strip() in text
    for tool in TOOLS:
        assert tool["function"]["name"] in instructions
