"""Secrets leave URLs before errors, logs, reprs and config.toml see them (loomrl.redact)."""

from __future__ import annotations

import sys
import time
import tomllib
import types

import pytest

from loomrl.redact import is_url, redact_text, redact_url, redact_value, secret_key
from loomrl.runs import toml_ready, write_run
from loomrl.train.loggers import open_sinks


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("https://user:p%40ss@h.example:8443/a?x=1", "https://***@h.example:8443/a?x=1"),
        ("https://ghp_tok3n@github.com/o/r.git", "https://***@github.com/o/r.git"),
        ("redis://:hunter2@localhost:6379/0", "redis://***@localhost:6379/0"),
        ("http://h/s?token=abc&mode=fast", "http://h/s?token=***&mode=fast"),
        ("http://h/s?Token=a&KEY=b&Api_Key=c&apikey=d&apiKey=e", None),
        ("http://h/?secret=a&password=b&sig=c&signature=d&access_token=e&auth=f", None),
        ("http://h/?X-Amz-Signature=a&X-Amz-Credential=b&client_secret=c&x-api-key=d", None),
        ("http://h/?keyword=a&design=b&monkey=c&page=2&q=token", "unchanged"),
        ("http://h/cb#access_token=abc&state=xyz", "http://h/cb#access_token=***&state=xyz"),
        ("http://h/?token=&key", "unchanged"),  # no value, nothing to hide
        ("http://u:p@[::1", "http://***@[::1"),  # malformed, still redacted
        ("http://h/a@b/c?x=1", "unchanged"),  # an @ in the path is no userinfo
        ("https://huggingface.co/org/model", "unchanged"),
        ("not a url", "unchanged"),
    ],
)
def test_redact_url(url, redacted):
    got = redact_url(url)
    if redacted == "unchanged":
        assert got == url
    elif redacted is None:  # every value masked, every key kept
        keys = [pair.split("=")[0] for pair in url.split("?")[1].split("&")]
        assert got == url.split("?")[0] + "?" + "&".join(f"{k}=***" for k in keys)
    else:
        assert got == redacted


def test_secret_keys_are_whole_words_in_any_case():
    assert all(
        secret_key(k)
        for k in ["token", "TOKEN", "api_key", "apiKey", "APIKEY", "x-api-key", "AWSAccessKeyId"]
    )
    assert not any(secret_key(k) for k in ["keyword", "design", "monkey", "tokens_per_s", "q"])


def test_urls_in_free_text_are_redacted_and_punctuation_kept():
    text = (
        "GET https://bot:pw@h.example/x?token=abc, then (see http://ok.example/) and "
        "'https://h?key=v'. Done at https://h/?sig=2."
    )
    assert redact_text(text) == (
        "GET https://***@h.example/x?token=***, then (see http://ok.example/) and "
        "'https://h?key=***'. Done at https://h/?sig=***."
    )
    assert redact_text("no links here") == "no links here"


def test_redaction_is_linear_on_long_text():
    """Each run of scheme characters is tried once: 100k characters of near-URLs stay cheap."""
    for text in ["a" * 100_000, "ab:/" * 25_000, "http:/" * 16_000, "x://" * 25_000]:
        start = time.thread_time()
        redact_text(text)
        is_url(text)
        assert time.thread_time() - start < 0.5


def test_is_url():
    assert is_url("https://h") and is_url("redis://:p@h:1/0")
    assert not any(is_url(v) for v in ["https://", "h/x", "see https://h", "file:///etc", ""])


def test_config_values_and_config_toml_never_hold_url_secrets(tmp_path):
    config = {
        "env": "qa",
        "env_args": {
            "endpoint": "https://bot:hunter2@api.example/v1?api_key=k1&lang=en",
            "prompt": "see https://h?token=kept-as-written in free text",
            "mirrors": ["http://h/x?sig=s1", "http://plain.example/"],
        },
        "engine_args": {"base_url": "http://127.0.0.1:8000/v1"},
        "out": tmp_path,
        "max_turns": None,
    }
    expected_args = {
        "endpoint": "https://***@api.example/v1?api_key=***&lang=en",
        "prompt": "see https://h?token=kept-as-written in free text",  # not a URL value
        "mirrors": ["http://h/x?sig=***", "http://plain.example/"],
    }
    assert redact_value(config["env_args"]) == expected_args
    ready = toml_ready(config)
    assert ready["env_args"] == expected_args
    assert ready["engine_args"] == {"base_url": "http://127.0.0.1:8000/v1"}
    write_run(tmp_path, [], {}, config)
    text = (tmp_path / "config.toml").read_text()
    assert "hunter2" not in text and "k1" not in text and "s1" not in text
    assert tomllib.loads(text)["env_args"] == expected_args


def test_metric_backends_record_the_config_redacted(tmp_path, monkeypatch):
    inits = []
    fake = types.SimpleNamespace(init=lambda **kw: inits.append(kw) or object())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = {"lr": 1e-5, "env_args": {"url": "https://u:pw@h.example/?token=t&n=1"}}
    open_sinks(["wandb"], tmp_path, config)
    assert inits[0]["config"] == {
        "lr": 1e-5,
        "env_args": {"url": "https://***@h.example/?token=***&n=1"},
    }
