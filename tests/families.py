"""Model families for the token-exactness tests: each family's chat template (fixtures),
markers, turn ends and tool-call parser, and the turns a model of the family writes in a
3-turn calculator episode (two calls, then the answer), taken from the template itself.

The default tokenizer stands in for each family's, given the family's markers."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import check_contract

from loomrl import parsers
from loomrl.envs.calculator import CalculatorEnv
from loomrl.tokens import ChatTokenizer
from loomrl.types import Status

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
DATA = Path(__file__).parent / "data"
HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>"]
HARMONY += ["<|constrain|>"]
MISTRAL = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
MISTRAL += ["[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
MISTRAL += ["[ARGS]", "[CALL_ID]"]
LLAMA = ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"]
QWEN = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>"]
QWEN += ["</think>"]
GLM = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
DEEPSEEK = [
    "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
]  # fmt: skip


@dataclass(frozen=True)
class Family:
    template: Path
    parser: str
    markers: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None  # the tokenizer's own (<|im_end|>) when None
    stops: tuple[str, ...] = ()  # markers that end a turn besides EOS
    # Mistral v0.3's template writes a system message into the last user turn only, so a
    # conversation with one does not re-render as its prompt was: the tools go to it.
    no_system: bool = False
    # The stand-in tokenizer splits the whitespace that ends these templates' generation
    # prompts ("\n\n") in two when text follows it, one token when it stands alone: the
    # model's turns cannot match a re-encoding there, so the check is on the text.
    text_level: bool = False
    # Rendering options: Llama 3.2's template writes today's date unless given one.
    template_kwargs: tuple[tuple[str, str], ...] = ()

    def chat(self, tok: Any) -> ChatTokenizer:
        return ChatTokenizer(tok, template_kwargs=dict(self.template_kwargs))


FAMILIES = {
    "mistral": Family(FIXTURES / "mistral.jinja", "mistral", (*MISTRAL,), "<s>", "</s>",
                      no_system=True),
    "gpt_oss": Family(FIXTURES / "gpt_oss.jinja", "harmony", (*HARMONY,), None, None,
                      ("<|call|>", "<|return|>")),
    "hermes": Family(DATA / "qwen3_chat_template.jinja", "hermes", (*QWEN,)),
    "qwen3_coder": Family(FIXTURES / "qwen3_coder.jinja", "qwen3_coder", (*QWEN,)),
    "qwen3_5": Family(FIXTURES / "qwen3_5.jinja", "qwen3_coder", (*QWEN,), text_level=True),
    "llama3_1": Family(FIXTURES / "llama3_1.jinja", "llama3_json", (*LLAMA,),
                       "<|begin_of_text|>", "<|eot_id|>", text_level=True),
    "llama3_2": Family(FIXTURES / "llama3_2.jinja", "llama3_json", (*LLAMA,),
                       "<|begin_of_text|>", "<|eot_id|>", text_level=True,
                       template_kwargs=(("date_string", "29 Nov 2026"),)),
    "mistral_args": Family(FIXTURES / "mistral_args.jinja", "mistral", (*MISTRAL,), "<s>", "</s>"),
    "glm45": Family(DATA / "glm4moe_chat_template.jinja", "glm45", (*GLM,), None, None,
                    ("<|user|>", "<|observation|>")),
    "deepseek_v3": Family(DATA / "deepseek_v3_chat_template.jinja", "deepseek_v3", (*DEEPSEEK,),
                          "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}  # fmt: skip

EXAMPLE = {"id": 0, "question": "What is 12 * 3 + 4?", "answer": 40}
# The calls the model makes; the ids are what Mistral v0.3 writes in its own calls.
CALLS = [("12 * 3", "a1B2c3D4e"), ("36 + 4", "f5G6h7I8j")]
RESULTS = ["36", "40"]


def family_tokenizer(base, family: Family):
    """``base`` (the default tokenizer) given ``family``'s markers, BOS/EOS and template:
    the stand-in for the family's own tokenizer."""
    tok = copy.deepcopy(base)
    special: dict = {"additional_special_tokens": list(family.markers)}
    if family.bos:
        special["bos_token"] = family.bos
    if family.eos:
        special["eos_token"] = family.eos
    tok.add_special_tokens(special)
    tok.chat_template = family.template.read_text()
    return tok


def ends(tok, family: Family) -> list[str]:
    return [tok.eos_token, *family.stops]


def written(tok, family: Family, message: dict, after: list[dict]) -> str:
    """What the model writes for ``message``: the template's rendering of it after a
    generation prompt, up to the first marker that ends a turn (GLM's template ends a
    turn with the next message's marker, which the model writes as its stop)."""
    user = [{"role": "user", "content": "Q"}]
    kwargs = dict(family.template_kwargs)
    prompt = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False, **kwargs)
    full = tok.apply_chat_template([*user, message, *after], tokenize=False, **kwargs)
    assert full.startswith(prompt)
    text = full[len(prompt) :]
    found = [(text.find(end), end) for end in ends(tok, family) if end in text]
    if not found:  # nothing follows the last message
        return text + family.stops[0]
    at, end = min(found)
    return text[: at + len(end)]


def replies(tok, family: Family) -> list[str]:
    """The model's three turns: two calls (each followed by its result), the answer."""
    out = []
    for (expression, id_), result in zip(CALLS, RESULTS, strict=True):
        call = {"name": "calculate", "arguments": {"expression": expression}}
        turn = {"role": "assistant", "content": "", "tool_calls": [
            {"id": id_, "type": "function", "function": call}
        ]}  # fmt: skip
        out.append(written(tok, family, turn, [tool_result(id_, result)]))
    answer = {"role": "assistant", "content": "Answer: 40"}
    return [*out, written(tok, family, answer, [])]


def tool_result(id_: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": id_, "name": "calculate", "content": content}


class Calculator(CalculatorEnv):
    """The calculator with no system message (its tools go to the template)."""

    system_prompt = None


def calculator(family: Family) -> CalculatorEnv:
    if family.no_system:
        return Calculator(parser=family.parser, tools_in_prompt=False)
    return CalculatorEnv(parser=family.parser)


def check_episode(tok, family: Family, chat, traj, prompts: list[list[int]], name: str) -> None:
    """The 3-turn episode of ``replies`` came out whole and token-exact: each prompt
    extends the context before it, the calls are structure with their ids answered by
    the results, and the trajectory is the template's rendering of the conversation."""
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.turns == 3 and traj.reward == 1.0
    assert traj.env_metrics["tool_calls"] == 2 and traj.env_metrics["tool_errors"] == 0
    full = traj.prompt_ids + traj.completion_ids
    assert len(prompts) == traj.turns  # one request per turn, each seen below
    for prompt in prompts:  # each prompt extends the context before it: nothing re-rendered
        assert full[: len(prompt)] == prompt

    calls = [m for m in traj.messages if m.get("tool_calls")]
    results = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["tool_calls"][0]["function"]["arguments"] for m in calls] == [
        {"expression": expression} for expression, _ in CALLS
    ]
    ids = [m["tool_calls"][0]["id"] for m in calls]
    assert [m["tool_call_id"] for m in results] == ids
    assert [m["content"] for m in results] == RESULTS
    if name == "mistral":
        assert ids == [id_ for _, id_ in CALLS]  # the ids the model wrote are kept
    stop_ids = {tok.eos_token_id, *tok.convert_tokens_to_ids(list(family.stops))}

    def view(messages):
        return parsers.template_messages(messages, parsers.get(family.parser))

    tools = calculator(family).reset(EXAMPLE).tools
    if not family.text_level:
        check_contract(tok, chat, traj, stop_ids, view=view, tools=tools)
        return
    rendered = chat.render(view(traj.messages), tools, add_generation_prompt=False)
    assert rendered.startswith(chat.decode(full))
    assert rendered[len(chat.decode(full)) :] in ("", "\n")  # ChatML's closing newline
