"""The glue after a model turn with tool calls (``ChatTokenizer.glue_ids(calls=...)``):
templates that render calls and tool results from structure get the turn's calls; the
template's spelling of the calls is never part of the glue, which starts at the turn's
closing (or after the end marker the model wrote itself)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from loomrl.tokens import ChatTokenizer, TemplateError

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>"]
MISTRAL = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]


def call(name: str, id_: str, **arguments: object) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def result(id_: str, content: str, name: str = "add") -> dict:
    return {"role": "tool", "tool_call_id": id_, "name": name, "content": content}


def family(tokenizer, template: str, markers: list[str], **special: str) -> ChatTokenizer:
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": markers, **special})
    return ChatTokenizer(tok, chat_template=(TEMPLATES / template).read_text())


@pytest.fixture(scope="module")
def oss(tokenizer) -> ChatTokenizer:
    return family(tokenizer, "gpt_oss.jinja", HARMONY)


@pytest.fixture(scope="module")
def mistral(tokenizer) -> ChatTokenizer:
    return family(tokenizer, "mistral.jinja", MISTRAL, bos_token="<s>", eos_token="</s>")


def test_gpt_oss_glue_closes_the_call_and_names_the_result_by_its_call(oss):
    (call_end,) = oss.call_end_ids
    assert oss.decode([call_end]) == "<|call|>" and oss.decode(oss.end_of_turn_ids) == "<|return|>"
    calls = [call("add", "call_1", a=2, b=3)]
    glue = oss.glue_ids([result("call_1", "5")], calls=calls)
    tail = '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"5"<|end|>'
    assert oss.decode(glue) == "<|call|>" + tail + "<|start|>assistant"
    # The model ended its turn with <|call|> itself: it is its token, not the glue's.
    assert oss.turn_end(oss.encode('{"a": 2}<|call|>')) == (call_end,)
    assert oss.glue_ids([result("call_1", "5")], calls=calls, turn_end=(call_end,)) == glue[1:]
    with pytest.raises(TemplateError, match="no previous assistant message with a tool call"):
        oss.glue_ids([result("call_1", "5")])  # no calls: the template cannot name the result


def test_mistral_glue_answers_the_call_id(mistral):
    glue = mistral.glue_ids([result("a1B2c3D4e", "5")], calls=[call("add", "a1B2c3D4e", a=2)])
    assert mistral.decode(glue) == (
        '</s>[TOOL_RESULTS] {"content": 5, "call_id": "a1B2c3D4e"}[/TOOL_RESULTS]'
    )
    turn_end = mistral.end_of_turn_ids
    assert (
        mistral.glue_ids(
            [result("a1B2c3D4e", "5")], calls=[call("add", "a1B2c3D4e")], turn_end=turn_end
        )
        == glue[len(turn_end) :]
    )


def test_the_glue_does_not_depend_on_the_arguments(oss):
    before = oss.cache_stats()["glue"].hits
    first = oss.glue_ids([result("call_9", "1")], calls=[call("add", "call_9", a=1)])
    second = oss.glue_ids([result("call_9", "1")], calls=[call("add", "call_9", a=2, b=3)])
    assert first == second and oss.cache_stats()["glue"].hits == before + 1


def test_a_template_that_renders_no_calls_gets_the_plain_glue(chat):
    """The default (ChatML) template writes no tool calls: the calls live in the text."""
    replies = [result("call_1", "5")]
    assert chat.glue_ids(replies, calls=[call("add", "call_1", a=2)]) == chat.glue_ids(replies)
    assert chat.call_end_ids == ()


def test_llama_with_two_calls_falls_back_to_the_plain_glue(tokenizer):
    """Llama 3.1's template refuses two calls in one turn; its tool results need no call,
    so the plain glue serves."""
    markers = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]
    llama = family(tokenizer, "llama3_1.jinja", markers, eos_token="<|eot_id|>")
    replies = [result("call_1", "5"), result("call_2", "6")]
    two = [call("add", "call_1"), call("add", "call_2")]
    assert llama.glue_ids(replies, calls=two) == llama.glue_ids(replies)
    one = llama.glue_ids(replies[:1], calls=two[:1])
    assert llama.decode(one) == (
        '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
