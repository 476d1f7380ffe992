"""``parser = "auto"``: each family's real chat template names its own tool-call parser,
and a template that renders no tool calls (the default model's ChatML) gets Hermes."""

from __future__ import annotations

import pytest
from families import FAMILIES

from loomrl import parsers
from loomrl.parsers import AUTO, FALLBACK, choose, detect


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_familys_template_names_the_familys_parser(name):
    family = FAMILIES[name]
    template = family.template.read_text()
    assert detect(template) == family.parser
    assert choose(template) == family.parser


def test_a_template_without_tool_calls_gets_the_fallback(tokenizer):
    assert "tool" not in tokenizer.chat_template  # the default model's ChatML
    assert detect(tokenizer.chat_template) is None
    assert choose(tokenizer.chat_template) == FALLBACK == "hermes"
    assert choose(None) == choose("") == FALLBACK


def test_named_templates_are_read_whole():
    """HF tokenizers may hold several named templates; a tool-use one decides."""
    mistral = FAMILIES["mistral"].template.read_text()
    assert detect({"default": "{{ messages }}", "tool_use": mistral}) == "mistral"
    assert detect({"default": "{{ messages }}"}) is None


def test_llama_3_without_the_ipython_role_renders_no_calls():
    """Llama 3.0's template has the header markers but no tool role: nothing to follow."""
    llama_3_0 = "<|start_header_id|>{{ message.role }}<|end_header_id|>{{ message.content }}"
    assert detect(llama_3_0) is None
    assert detect(llama_3_0 + "{% if message.role == 'ipython' %}{% endif %}") == "llama3_json"


def test_auto_is_no_parser_of_its_own():
    assert AUTO not in parsers.available()
    with pytest.raises(ValueError, match=r"'auto' is no parser: parsers.choose"):
        parsers.get(AUTO)
