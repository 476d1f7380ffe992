"""Token layer: prompt ids, glue by probe, caches, verify — on the default tokenizer."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from loomrl.lru import LRUCache
from loomrl.models import resolve
from loomrl.token_check import verify
from loomrl.tokens import ChatTokenizer, TemplateError, TemplateWarning

QWEN3_TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
# GLM-4.5's chat format: nothing closes an assistant turn, the model ends it by emitting
# the next role marker (<|user|>, <|observation|>). The markers are special tokens.
GLM_TEMPLATE = (Path(__file__).parent / "data" / "glm4moe_chat_template.jinja").read_text()
GLM_TOKENS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
GLM_TOKENS += ["<think>", "</think>", "<tool_response>", "</tool_response>"]
QWEN3_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
USER = {"role": "user", "content": "What is 2 + 3?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]


@pytest.fixture(scope="module")
def base_tokenizer():
    return AutoTokenizer.from_pretrained(resolve("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def chatml(base_tokenizer) -> ChatTokenizer:
    return ChatTokenizer(base_tokenizer)


@pytest.fixture(scope="module")
def qwen_tokenizer(base_tokenizer):
    tok = copy.deepcopy(base_tokenizer)
    tok.add_tokens(QWEN3_TOKENS)
    return tok


@pytest.fixture(scope="module")
def qwen3(qwen_tokenizer) -> ChatTokenizer:
    return ChatTokenizer(qwen_tokenizer, chat_template=QWEN3_TEMPLATE)


@pytest.fixture(scope="module")
def glm_tokenizer(base_tokenizer):
    tok = copy.deepcopy(base_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": GLM_TOKENS})
    return tok


@pytest.fixture(scope="module")
def glm(glm_tokenizer) -> ChatTokenizer:
    with pytest.warns(TemplateWarning):
        return ChatTokenizer(glm_tokenizer, chat_template=GLM_TEMPLATE)


def rollout(chat: ChatTokenizer, first: list[dict], turns: list, tools=None):
    """Build a trajectory the way the turn loop does: prompt, then (model ids, glue) pairs.

    ``turns`` holds ``(model_text, finish, env_messages_or_None)``; the model's ids are the
    text's tokens plus the end-of-turn token(s) when ``finish == "stop"``.
    """
    ids = chat.prompt_ids(first, tools)
    mask = [0] * len(ids)
    messages, spans = list(first), []
    for text, finish, env in turns:
        gen = chat.encode(text) + (list(chat.end_of_turn_ids) if finish == "stop" else [])
        spans.append((len(ids), len(ids) + len(gen)))
        ids += gen
        mask += [1] * len(gen)
        messages.append({"role": "assistant", "content": text})
        if env is not None:
            glue = chat.glue_ids(env, ended_with_eot=chat.ends_with_eot(gen), tools=tools)
            ids += glue
            mask += [0] * len(glue)
            messages += env
    return ids, mask, messages, spans


def count(seq: list[int], sub: tuple[int, ...]) -> int:
    return sum(tuple(seq[i : i + len(sub)]) == sub for i in range(len(seq) - len(sub) + 1))


# -- ChatML (the default template, round-trips) ------------------------------------------


def test_default_vocab_has_chatml_markers(base_tokenizer):
    for marker in ("<|im_start|>", "<|im_end|>"):
        assert len(base_tokenizer.encode(marker, add_special_tokens=False)) == 1


def test_chatml_end_of_turn_found_by_probe(chatml, base_tokenizer):
    im_end = base_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chatml.end_of_turn_ids == (im_end,)
    assert chatml.decode(chatml.closing_ids) == "<|im_end|>\n"


def test_from_model_uses_the_default_model(chatml):
    chat = ChatTokenizer.from_model(cache_size=8)
    assert chat.end_of_turn_ids == chatml.end_of_turn_ids
    assert chat.cache_stats()["prompt"].capacity == 8


def test_prompt_ids_are_the_template_rendering(chatml, base_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, USER]
    text = base_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = chatml.prompt_ids(messages)
    assert ids == base_tokenizer.encode(text, add_special_tokens=False)
    assert chatml.decode(ids).endswith("<|im_start|>assistant\n")


def test_glue_after_eot_does_not_repeat_it(chatml):
    glue = chatml.glue_ids([{"role": "user", "content": "And 4 + 4?"}], ended_with_eot=True)
    expected = "\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n"
    assert chatml.decode(glue) == expected
    ids, *_ = rollout(chatml, [USER], [("5", "stop", [{"role": "user", "content": "And 4 + 4?"}])])
    assert "5<|im_end|>\n<|im_start|>user" in chatml.decode(ids)
    assert count(ids, chatml.end_of_turn_ids * 2) == 0


def test_glue_after_length_cut_closes_the_turn_once(chatml):
    glue = chatml.glue_ids([{"role": "user", "content": "Go on."}], ended_with_eot=False)
    eot = chatml.end_of_turn_ids
    assert tuple(glue[: len(eot)]) == eot
    assert tuple(glue[len(eot) : 2 * len(eot)]) != eot
    ids, mask, _, _ = rollout(chatml, [USER], [("The answer is", "length", [USER])])
    text = chatml.decode(ids)
    assert "The answer is<|im_end|>\n<|im_start|>user" in text
    closing_at = len(ids) - len(chatml.glue_ids([USER], ended_with_eot=False))
    assert mask[closing_at] == 0  # the closing eot is glue, not the model's


def test_glue_with_no_env_messages_only_reopens_the_assistant(chatml):
    glue = chatml.glue_ids([], ended_with_eot=True)
    assert chatml.decode(glue) == "\n<|im_start|>assistant\n"


def test_chatml_rollout_equals_rerender_and_verifies(chatml):
    turns = [
        ("Let me think.", "length", [{"role": "user", "content": "Continue."}]),
        ("It is 5.", "stop", [{"role": "user", "content": "Sure?"}]),
        ("Yes, 5.", "stop", None),
    ]
    ids, mask, messages, spans = rollout(chatml, [USER], turns)
    result = verify(chatml, messages, ids)
    assert result.ok and result, str(result)
    assert chatml.decode(result.leftover) == "\n"  # only the closing newline is left over
    rendered = chatml.render(messages, add_generation_prompt=False)
    assert rendered.startswith(chatml.decode(ids))
    assert ids == chatml.encode(rendered)[: len(ids)]
    for (start, end), (text, finish, _) in zip(spans, turns, strict=True):
        assert all(mask[start:end]) and sum(mask) == sum(e - s for s, e in spans)
        assert chatml.decode(ids[start:end]) == text + ("<|im_end|>" if finish == "stop" else "")


def test_verify_allows_an_unclosed_final_turn(chatml):
    ids, _, messages, _ = rollout(chatml, [USER], [("It is", "length", None)])
    result = verify(chatml, messages, ids)
    assert result.ok and chatml.decode(result.leftover) == "<|im_end|>\n"


def test_verify_reports_the_first_differing_token(chatml):
    ids, _, messages, _ = rollout(chatml, [USER], [("It is five.", "stop", None)])
    assert chatml.decode(ids[-3:-2]) == " five"
    wrong = [*ids[:-3], chatml.encode(" six")[0], *ids[-2:]]
    result = verify(chatml, messages, wrong)
    assert not result.ok and not result
    assert result.index == len(ids) - 3
    assert (result.expected_id, result.actual_id) == (ids[-3], wrong[-3])
    assert result.context.endswith("<|im_start|>assistant\nIt is")
    assert "drift at token" in str(result) and "' six'" in str(result)


def test_verify_reports_ids_that_end_early_or_run_past(chatml):
    ids, _, messages, _ = rollout(chatml, [USER], [("It is 5.", "stop", None)])
    short = verify(chatml, messages, ids[:-4])
    assert not short.ok and short.index == len(ids) - 4 and short.actual_id is None
    longer = verify(chatml, messages, [*ids, 198, 198, 198])
    assert not longer.ok and longer.expected_id is None
    assert verify(chatml, messages, [*ids, 198]).ok  # the rendering's own closing newline


def test_verify_with_generation_prompt(chatml):
    env = [{"role": "user", "content": "Again?"}]
    ids, _, messages, _ = rollout(chatml, [USER], [("5", "stop", env)])
    assert verify(chatml, messages, ids, add_generation_prompt=True).ok
    assert not verify(chatml, messages, ids).ok


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(
        st.tuples(
            st.from_regex(r"[A-Za-z][A-Za-z0-9 ,.!?]{0,30}", fullmatch=True),
            st.sampled_from(["stop", "length"]),
            st.from_regex(r"[A-Za-z][A-Za-z0-9 ,.?]{0,20}", fullmatch=True),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_chatml_rollouts_round_trip(chatml, turns):
    shaped = [(a, f, [{"role": "user", "content": u}]) for a, f, u in turns]
    ids, _, messages, _ = rollout(chatml, [USER], shaped)
    assert verify(chatml, messages, ids, add_generation_prompt=True).ok


# -- Qwen3 (strips earlier <think> blocks, renders tools) ---------------------------------


def test_qwen3_end_of_turn_is_im_end(qwen3, qwen_tokenizer):
    assert qwen3.end_of_turn_ids == (qwen_tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert qwen3.decode(qwen3.closing_ids) == "<|im_end|>\n"


def test_qwen3_single_turn_with_think_round_trips(qwen3):
    reply = "<think>\n2 plus 3.\n</think>\n\nIt is 5."
    ids, _, messages, _ = rollout(qwen3, [USER], [(reply, "stop", None)])
    assert verify(qwen3, messages, ids).ok


def test_qwen3_think_stripping_keeps_rollout_aligned_and_verify_shows_drift(qwen3):
    think = qwen3.tokenizer.convert_tokens_to_ids("<think>")
    first = "<think>\n2 plus 3.\n</think>\n\nIt is 5."
    second = "<think>\n4 plus 4.\n</think>\n\nIt is 8."
    follow_up = {"role": "user", "content": "And 4 + 4?"}
    ids, _, messages, spans = rollout(
        qwen3, [USER], [(first, "stop", [follow_up]), (second, "stop", None)]
    )
    # What the model saw: its own tokens (think included), then the glue, then its tokens.
    seen = (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
        f"{first}<|im_end|>\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n"
        f"<|im_start|>assistant\n{second}<|im_end|>"
    )
    assert qwen3.decode(ids) == seen
    assert ids.count(think) == 2
    assert qwen3.decode(ids[spans[0][0] : spans[0][1]]) == first + "<|im_end|>"
    # A rollout that re-rendered history would have prompted turn 2 without the think block.
    assert qwen3.prompt_ids(messages[:3]) != ids[: spans[1][0]]
    assert qwen3.prompt_ids(messages[:3]).count(think) == 0
    # A re-render strips the first think block: verify points at it.
    result = verify(qwen3, messages, ids)
    assert not result.ok
    assert result.index == spans[0][0]
    assert result.actual_id == think
    assert result.expected_text.startswith("It is 5.")
    assert result.context.endswith("<|im_start|>assistant\n")
    assert f"drift at token {spans[0][0]}" in str(result)


def test_qwen3_prompt_renders_tools(qwen3):
    with_tools = qwen3.decode(qwen3.prompt_ids([USER], TOOLS))
    assert "# Tools" in with_tools and '"name": "add"' in with_tools
    assert "# Tools" not in qwen3.decode(qwen3.prompt_ids([USER]))


def test_qwen3_tool_response_glue(qwen3):
    env = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "8"}]
    glue = qwen3.glue_ids(env, ended_with_eot=True, tools=TOOLS)
    assert qwen3.decode(glue) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\n8\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    ids, _, _, _ = rollout(qwen3, [USER], [(call, "stop", env)], tools=TOOLS)
    assert f"{call}<|im_end|>\n<|im_start|>user\n<tool_response>\n5" in qwen3.decode(ids)
    assert qwen3.tokenizer.convert_tokens_to_ids("<tool_call>") in ids


def test_template_kwargs_reach_every_rendering(qwen_tokenizer):
    chat = ChatTokenizer(
        qwen_tokenizer, chat_template=QWEN3_TEMPLATE, template_kwargs={"enable_thinking": False}
    )
    empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert chat.decode(chat.prompt_ids([USER])).endswith(empty_think)
    assert chat.decode(chat.glue_ids([USER], ended_with_eot=True)).endswith(empty_think)


# -- GLM-4.5 (no closing: the model ends its turn with the next role marker) ---------------


def marker(chat: ChatTokenizer, token: str) -> int:
    return chat.tokenizer.convert_tokens_to_ids(token)


def test_glm_probe_finds_no_closing_and_the_reply_markers(glm):
    user, observation = marker(glm, "<|user|>"), marker(glm, "<|observation|>")
    assert glm.closing_ids == () and glm.end_of_turn_ids == ()
    assert glm.reply_marker_ids == ((user,), (observation,))
    assert glm.turn_end(glm.encode("It is 5.<|user|>")) == (user,)
    assert glm.turn_end(glm.encode("It is 5.<|observation|>")) == (observation,)
    assert glm.turn_end(glm.encode("It is 5.<|assistant|>")) == ()
    assert glm.turn_end(glm.encode("It is 5.")) == () and glm.turn_end([]) == ()


def test_glm_template_warns_once_at_probe_time(glm_tokenizer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chat = ChatTokenizer(glm_tokenizer, chat_template=GLM_TEMPLATE)
        chat.prompt_ids([USER])
        chat.glue_ids([USER], turn_end=chat.reply_marker_ids[0])
        chat.glue_ids([{"role": "tool", "content": "5"}])
    assert [w.category for w in caught] == [TemplateWarning]
    text = str(caught[0].message)
    assert "renders nothing after an assistant turn" in text
    assert "next role marker ('<|user|>' or '<|observation|>')" in text
    assert "stop tokens" in text
    assert caught[0].filename == __file__  # points at the caller that built it


def test_template_with_no_closing_and_no_markers_warns_that_turns_cannot_end(base_tokenizer):
    template = (
        "{% for m in messages %}{% if not loop.first %}\n{% endif %}{{ m.role }}: "
        "{{ m.content }}{% endfor %}{% if add_generation_prompt %}\nassistant: {% endif %}"
    )
    with pytest.warns(TemplateWarning, match="only end by a stop string or max_tokens"):
        chat = ChatTokenizer(base_tokenizer, chat_template=template)
    assert chat.closing_ids == () and chat.reply_marker_ids == ()


def test_templates_with_a_closing_do_not_warn(base_tokenizer, qwen_tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chatml = ChatTokenizer(base_tokenizer)
        ChatTokenizer(qwen_tokenizer, chat_template=QWEN3_TEMPLATE)
    im_end = base_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chatml.reply_marker_ids == ((im_end,),)  # the same token as the end of turn


def test_chatml_turn_end_is_the_end_of_turn_rule(chatml):
    im_end = chatml.end_of_turn_ids
    assert chatml.turn_end(chatml.encode("It is 5.<|im_end|>")) == im_end
    assert chatml.turn_end(chatml.encode("It is 5.")) == ()
    assert chatml.turn_end(chatml.encode("It is 5.<|endoftext|>")) == ()
    env = [{"role": "user", "content": "And 4 + 4?"}]
    assert chatml.glue_ids(env, turn_end=im_end) == chatml.glue_ids(env, ended_with_eot=True)
    assert chatml.glue_ids(env, turn_end=()) == chatml.glue_ids(env, ended_with_eot=False)


def test_glm_glue_skips_the_marker_the_model_emitted(glm):
    user, observation = marker(glm, "<|user|>"), marker(glm, "<|observation|>")
    ask = [{"role": "user", "content": "And 4 + 4?"}]
    assert glm.decode(glm.glue_ids(ask)) == "<|user|>\nAnd 4 + 4?<|assistant|>"
    assert glm.decode(glm.glue_ids(ask, turn_end=(user,))) == "\nAnd 4 + 4?<|assistant|>"
    tools = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "8"}]
    rest = "\n<tool_response>\n5\n</tool_response>\n<tool_response>\n8\n</tool_response>"
    assert glm.decode(glm.glue_ids(tools)) == f"<|observation|>{rest}<|assistant|>"
    assert glm.decode(glm.glue_ids(tools, turn_end=(observation,))) == f"{rest}<|assistant|>"
    # ended_with_eot has nothing to skip: the template has no end-of-turn token.
    assert glm.glue_ids(ask, ended_with_eot=True) == glm.glue_ids(ask)


def test_glm_glue_after_a_different_marker_is_whole(glm):
    user, observation = marker(glm, "<|user|>"), marker(glm, "<|observation|>")
    tools = [{"role": "tool", "content": "5"}]
    assert glm.glue_ids(tools, turn_end=(user,)) == glm.glue_ids(tools)
    ask = [{"role": "user", "content": "Go on."}]
    assert glm.glue_ids(ask, turn_end=(observation,)) == glm.glue_ids(ask)
    assert glm.decode(glm.glue_ids([], turn_end=(user,))) == "<|assistant|>"


def glm_rollout(chat: ChatTokenizer, turns: list) -> tuple[list[int], list[dict]]:
    """Prompt, then per turn the model's text and stop marker (or ``None``: cut by
    max_tokens) and the env's reply, glued the way the turn loop glues them."""
    ids, messages = chat.prompt_ids([USER]), [USER]
    for text, stop, env in turns:
        gen = chat.encode(text) + ([marker(chat, stop)] if stop else [])
        ids += gen
        messages.append({"role": "assistant", "content": text})
        if env is not None:
            ids += chat.glue_ids(env, turn_end=chat.turn_end(gen))
            messages += env
    return ids, messages


def test_glm_rollout_round_trips_and_verify_accepts_the_final_marker(glm):
    reply = "\n<think></think>\n"
    ask, tool = [{"role": "user", "content": "And 4 + 4?"}], [{"role": "tool", "content": "8"}]
    turns = [
        (reply + "It is 5.", "<|user|>", ask),
        (reply + "Let me add.", "<|observation|>", tool),
        (reply + "Cut by max", None, ask),
        (reply + "It is 8.", "<|user|>", None),
    ]
    ids, messages = glm_rollout(glm, turns)
    text = glm.decode(ids)
    assert "It is 5.<|user|>\nAnd 4 + 4?<|assistant|>" in text
    assert "Let me add.<|observation|>\n<tool_response>\n8" in text
    assert "Cut by max<|user|>\nAnd 4 + 4?" in text
    assert "<|user|><|user|>" not in text and "<|observation|><|observation|>" not in text
    result = verify(glm, messages, ids)
    assert result.ok, result.message
    assert result.ended_by == (marker(glm, "<|user|>"),) and result.leftover == ()
    assert "turn ended by: '<|user|>'" in result.message
    assert verify(glm, messages, ids[:-1]).ok  # a last turn cut by max_tokens
    last_turn = len(glm.encode(reply + "It is 8.")) + 1
    assert verify(glm, messages[:-1], ids[:-last_turn], add_generation_prompt=True).ok


def test_glm_verify_refuses_ids_past_the_rendering_that_are_no_reply_marker(glm):
    ids, messages = glm_rollout(glm, [("\n<think></think>\nIt is 5.", None, None)])
    assistant = marker(glm, "<|assistant|>")
    result = verify(glm, messages, [*ids, assistant])
    assert not result.ok and result.expected_id is None and result.actual_id == assistant
    doubled = verify(glm, messages, [*ids, marker(glm, "<|user|>"), marker(glm, "<|user|>")])
    assert not doubled.ok and doubled.index == len(ids)


def test_glm_verify_shows_a_mismatched_marker_as_drift(glm):
    tool = [{"role": "tool", "content": "8"}]
    turns = [
        ("\n<think></think>\nLet me add.", "<|user|>", tool),
        ("\n<think></think>\nOk", None, None),
    ]
    ids, messages = glm_rollout(glm, turns)
    assert "Let me add.<|user|><|observation|>\n<tool_response>" in glm.decode(ids)
    result = verify(glm, messages, ids)
    assert not result.ok
    assert (result.actual_id, result.expected_id) == (
        marker(glm, "<|user|>"),
        marker(glm, "<|observation|>"),
    )
    assert result.context.endswith("Let me add.")


# -- templates the probe must refuse -------------------------------------------------------


def test_template_that_drops_assistant_content_fails_loudly(base_tokenizer):
    template = (
        "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}"
        "{% endfor %}"
    )
    with pytest.raises(TemplateError, match=r"appears 0 times.*drops or rewrites"):
        ChatTokenizer(base_tokenizer, chat_template=template)


def test_template_that_repeats_assistant_content_fails_loudly(base_tokenizer):
    template = "{% for m in messages %}{{ m.content }}{{ m.content }}<|im_end|>{% endfor %}"
    with pytest.raises(TemplateError, match=r"appears 2 times.*repeats it"):
        ChatTokenizer(base_tokenizer, chat_template=template)


def test_tokens_merging_across_the_turn_end_fail_loudly(base_tokenizer):
    template = "{% for m in messages %}{{ m.content }}s<|im_end|>{% endfor %}"
    with pytest.raises(TemplateError, match="merges text across the end"):
        ChatTokenizer(base_tokenizer, chat_template=template)


def test_turn_closed_differently_mid_conversation_fails_at_glue(base_tokenizer):
    template = (
        "{% for m in messages %}{{ m.content }}{% if loop.last %}<|im_end|>{% else %}"
        "<|endoftext|>{% endif %}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    chat = ChatTokenizer(base_tokenizer, chat_template=template)
    with pytest.raises(TemplateError, match="not closed by the end-of-turn"):
        chat.glue_ids([USER], ended_with_eot=True)


def test_template_errors_are_wrapped(base_tokenizer):
    template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(TemplateError, match="roles must alternate"):
        ChatTokenizer(base_tokenizer, chat_template=template)


def test_missing_chat_template_fails_loudly(base_tokenizer):
    tok = copy.deepcopy(base_tokenizer)
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatTokenizer(tok)


def test_plain_text_template_has_no_eot_and_always_closes(base_tokenizer):
    template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    chat = ChatTokenizer(base_tokenizer, chat_template=template)
    assert chat.end_of_turn_ids == () and not chat.ends_with_eot([1, 2])
    glue = chat.glue_ids([USER], ended_with_eot=True)
    assert glue == chat.glue_ids([USER], ended_with_eot=False)
    assert chat.decode(glue) == "\n\nuser: What is 2 + 3?\n\nassistant:"


# -- caches ------------------------------------------------------------------------------


def test_lru_cache_evicts_oldest_and_counts():
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now most recent
    cache.put("c", 3)  # evicts "b"
    assert cache.get("b") is None and cache.get("c") == 3
    for i in range(100):  # never freezes: keeps admitting new keys
        cache.put(f"k{i}", i)
        assert len(cache) <= 2
    assert cache.get("k99") == 99 and cache.get("a") is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size, stats.capacity) == (3, 2, 2, 2)
    assert stats.evictions == 101
    with pytest.raises(ValueError):
        LRUCache(0)


def test_chat_tokenizer_caches_are_bounded(base_tokenizer):
    chat = ChatTokenizer(base_tokenizer, cache_size=2)
    convs = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]
    first = chat.prompt_ids(convs[0])
    for conv in convs:
        chat.prompt_ids(conv)
        chat.glue_ids(conv, ended_with_eot=True)
    stats = chat.cache_stats()
    assert stats["prompt"].size == 2 and stats["glue"].size == 2
    assert stats["prompt"].hits == 1 and stats["prompt"].misses == 3
    assert chat.prompt_ids(convs[0]) == first  # evicted, recomputed identically
    assert chat.cache_stats()["prompt"].misses == 4


def test_cache_key_ignores_dict_order_and_results_are_copies(base_tokenizer):
    chat = ChatTokenizer(base_tokenizer)
    ids = chat.prompt_ids([{"role": "user", "content": "hi"}])
    ids.append(-1)  # callers may extend their list without corrupting the cache
    again = chat.prompt_ids([{"content": "hi", "role": "user"}])
    assert again[-1] != -1 and chat.cache_stats()["prompt"].hits == 1
    glue = chat.glue_ids([USER], ended_with_eot=False)
    glue.clear()
    assert chat.glue_ids([USER], ended_with_eot=True)
    assert chat.cache_stats()["glue"].hits == 1  # both variants share one entry


def test_cached_calls_are_cheap(base_tokenizer, monkeypatch):
    """A cache hit neither renders the template nor tokenizes: the two costly steps."""
    chat = ChatTokenizer(base_tokenizer)
    env = [{"role": "user", "content": "x" * 200}]
    glue, prompt = chat.glue_ids(env, ended_with_eot=True), chat.prompt_ids([USER])
    calls = {"render": 0, "encode": 0}

    def counted(name: str):
        real = getattr(chat, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    for name in calls:
        monkeypatch.setattr(chat, name, counted(name))
    for _ in range(2000):
        assert chat.glue_ids(env, ended_with_eot=True) == glue
        assert chat.prompt_ids([USER]) == prompt
    assert calls == {"render": 0, "encode": 0}
    assert chat.cache_stats()["glue"].hits == chat.cache_stats()["prompt"].hits == 2000
    chat.prompt_ids([USER, {"role": "assistant", "content": "new"}])  # a miss does both
    assert calls == {"render": 1, "encode": 1}


def test_cache_key_is_exact(base_tokenizer):
    chat = ChatTokenizer(base_tokenizer)
    variants = [
        [{"role": "user", "content": "hi", "extra": True}],
        [{"role": "user", "content": "hi", "extra": 1}],
        [{"role": "user", "content": "hi", "extra": [["a", 1]]}],
        [{"role": "user", "content": "hi", "extra": {"a": 1}}],
    ]
    for messages in variants:
        chat.prompt_ids(messages)
    assert chat.cache_stats()["prompt"].misses == len(variants)
    chat.prompt_ids([{"extra": {"a": 1}, "content": "hi", "role": "user"}])
    assert chat.cache_stats()["prompt"].hits == 1
