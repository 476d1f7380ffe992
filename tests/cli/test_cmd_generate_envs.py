"""``loomrl generate`` (flag checks before the engine, plain output) and ``loomrl envs``
(lists every registered environment; user strings are not Rich markup)."""

from __future__ import annotations

import pytest

from loomrl.envs import Environment, registry


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
        (["--max-model-len", "1"], "--max-model-len must be at least 2, got 1"),
        (["--temperature", "-1"], "--temperature must be a finite number >= 0, got -1.0"),
        (["--temperature", "inf"], "--temperature must be a finite number >= 0, got inf"),
        (["--seed", "-1"], "--seed must be from 0 to 4294967295, got -1"),
        (["--seed", str(2**32)], "--seed must be from 0 to 4294967295, got 4294967296"),
        (["--model", "no-such-model"], "unknown model 'no-such-model': expected one of"),
        (["--model", "tiny-random:x"], "model spec 'tiny-random:x': the seed after"),
    ],
)
def test_bad_flags_are_one_line_before_any_engine(cli, extra, message):
    result = cli("generate", "hello", *extra)
    assert result.code == 2 and result.error.startswith(message)


def test_a_model_directory_missing_files_is_named(cli, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = cli("generate", "hi", "--model", tmp_path)
    assert result.error == (
        f"model directory '{tmp_path}' is missing: weights (*.safetensors or *.bin), "
        "tokenizer (tokenizer.json or tokenizer.model), tokenizer_config.json"
    )


def test_generate_prints_the_reply_as_written(cli, scripted, monkeypatch):
    result = cli("generate", "[bold]hi[/]", "--max-tokens", "16")
    assert result.code == 0, result.err
    assert "Answer: 0 my guess is 7" in result.out
    assert "tokens in" in result.out and "model=smollm2-135m-instruct" in result.out
    assert len(scripted) == 1


class Plain(Environment):
    name = "plain"


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))


def test_envs_lists_every_registered_environment(cli):
    result = cli("envs")
    assert result.code == 0 and result.err == ""
    for name, description in registry.available().items():
        assert name in result.out
        assert description.split()[0] in result.out


def test_envs_prints_markup_characters_as_written(cli, clean_registry):
    registry.register("[train]", Plain, "uses [/x] and [bold]tags[/bold]")
    result = cli("envs")
    assert result.code == 0, result.err
    assert "[train]" in result.out and "uses [/x] and [bold]tags[/bold]" in result.out
