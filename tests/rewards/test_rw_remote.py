"""RemoteReward against a real HTTP server on 127.0.0.1 (see conftest.reward_server)."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings

import pytest

from loomrl.rewards import Recipe, RemoteReward, RemoteRewardError, RewardError, RewardSample
from loomrl.rewards import remote as remote_module

TOKEN = "s3cret-Token-123"
ENV = "LOOMRL_TEST_REWARD_TOKEN"


def samples(n: int = 3) -> list[RewardSample]:
    return [
        RewardSample(prompt=f"q{i}", completion="x" * (i + 1), example={"id": i}, label="chat")
        for i in range(n)
    ]


def remote(url: str, **kwargs) -> RemoteReward:
    kwargs.setdefault("timeout_s", 2.0)
    kwargs.setdefault("retries", 0)
    kwargs.setdefault("backoff_s", 0.01)
    return RemoteReward(url, **kwargs)


async def test_success_sends_the_documented_request(reward_server):
    scores = await remote(reward_server.url)(samples())
    assert scores == [1.0, 2.0, 3.0]
    (request,) = reward_server.requests
    assert request["path"] == "/score" and request["auth"] is None
    assert request["body"]["items"][1] == {
        "prompt": "q1",
        "completion": "xx",
        "messages": [],
        "example": {"id": 1},
        "label": "chat",
    }


async def test_batches_split_requests_and_keep_order(reward_server):
    scores = await remote(reward_server.url, batch_size=2, max_concurrency=2)(samples(5))
    assert scores == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert sorted(len(r["body"]["items"]) for r in reward_server.requests) == [1, 2, 2]
    assert await remote(reward_server.url)([]) == []


async def test_a_server_that_is_down_is_a_clear_error(dead_url):
    with pytest.raises(
        RemoteRewardError,
        match=rf"reward server {dead_url}: connection refused "
        r"\(is the server running\?\) \(gave up after 3 attempts\)",
    ):
        await remote(dead_url, retries=2)(samples(1))


async def test_a_slow_server_times_out(reward_server):
    """The server answers only once the client has given up: only its timeout ends the call."""
    gave_up = threading.Event()
    reward_server.score = lambda item: float(gave_up.wait(30))
    try:
        with pytest.raises(
            RemoteRewardError,
            match=rf"reward server {reward_server.url}: no response "
            r"within timeout_s=0.2s$",
        ):
            await remote(reward_server.url, timeout_s=0.2)(samples(1))
    finally:
        gave_up.set()
    assert len(reward_server.requests) == 1


async def test_a_timeout_is_retried_and_the_retry_can_succeed(reward_server):
    retried = threading.Event()

    def score(item):
        if len(reward_server.requests) == 1:  # the first attempt answers after the retry came
            retried.wait(30)
        retried.set()
        return float(len(item["completion"]))

    reward_server.score = score
    assert await remote(reward_server.url, timeout_s=1.0, retries=1)(samples(2)) == [1.0, 2.0]
    assert len(reward_server.requests) == 2


async def test_a_transient_503_is_retried_with_backoff(reward_server, monkeypatch):
    reward_server.then(503, "overloaded")
    reward_server.then(503, "overloaded")
    backoffs = []

    class Clock:
        """``asyncio`` inside the client, with ``sleep`` recorded instead of waited."""

        def __getattr__(self, name):
            return getattr(asyncio, name)

        async def sleep(self, seconds: float) -> None:
            backoffs.append(seconds)

    monkeypatch.setattr(remote_module, "asyncio", Clock())
    source = remote(reward_server.url, retries=3, backoff_s=0.05, max_backoff_s=0.08)
    assert await source(samples(2)) == [1.0, 2.0]
    assert len(reward_server.requests) == 3
    assert backoffs == [0.05, 0.08]  # 0.05 s, then 0.1 s capped by max_backoff_s


async def test_retries_are_bounded(reward_server):
    for _ in range(5):
        reward_server.then(503, "overloaded")
    with pytest.raises(
        RemoteRewardError,
        match=r"HTTP 503 Service Unavailable: overloaded "
        r"\(gave up after 3 attempts\)",
    ):
        await remote(reward_server.url, retries=2)(samples(1))
    assert len(reward_server.requests) == 3


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"scores": [1.0, 2.0]}', r"returned 2 scores for 3 items"),
        ('{"scores": [1.0, NaN, 2.0]}', r"score 1 is nan, expected a finite number"),
        ('{"scores": [1.0, Infinity, 2.0]}', r"score 1 is inf, expected a finite number"),
        ('{"scores": [1.0, "2", 2.0]}', r"score 1 is '2', expected a number"),
        (
            '{"rewards": [1, 2, 3]}',
            r"response JSON has no 'scores' list \(got keys \['rewards'\]\)",
        ),
        ("[1, 2, 3]", r"response JSON has no 'scores' list \(got list\)"),
        ("<html>oops</html>", r"response is not JSON: '<html>oops</html>'"),
    ],
)
async def test_bad_answers_are_not_retried_and_name_the_problem(reward_server, body, problem):
    reward_server.then(200, body)
    with pytest.raises(RemoteRewardError, match=rf"reward server {reward_server.url}: {problem}$"):
        await remote(reward_server.url, retries=3)(samples(3))
    assert len(reward_server.requests) == 1


async def test_http_errors_quote_the_status_and_body(reward_server):
    reward_server.then(422, json.dumps({"detail": "completion too long"}))
    with pytest.raises(
        RemoteRewardError,
        match=r"HTTP 422 Unprocessable Entity: "
        r'\{"detail": "completion too long"\}$',
    ):
        await remote(reward_server.url, retries=3)(samples(1))
    assert len(reward_server.requests) == 1


async def test_redirects_are_not_followed(reward_server):
    reward_server.then(307, "moved")
    with pytest.raises(
        RemoteRewardError,
        match=r"HTTP 307 Temporary Redirect: redirects are not "
        r"followed$",
    ):
        await remote(reward_server.url, retries=3)(samples(1))
    assert len(reward_server.requests) == 1


async def test_the_bearer_token_is_sent_from_the_environment(reward_server, monkeypatch):
    reward_server.token = TOKEN
    monkeypatch.setenv(ENV, TOKEN)
    source = remote(reward_server.url, token_env=ENV)
    assert await source(samples(2)) == [1.0, 2.0]
    assert reward_server.requests[0]["auth"] == f"Bearer {TOKEN}"
    assert TOKEN not in repr(source) and TOKEN not in str(vars(source))
    assert repr(source) == f"RemoteReward({reward_server.url!r}, token_env={ENV!r})"


async def test_no_token_gives_a_clear_401(reward_server):
    reward_server.token = TOKEN
    with pytest.raises(
        RemoteRewardError,
        match=r"HTTP 401 Unauthorized \(no bearer token was "
        r"sent; set token_env= to the variable holding it\)",
    ):
        await remote(reward_server.url, retries=2)(samples(1))
    assert len(reward_server.requests) == 1


async def test_a_refused_token_never_appears_in_the_error(reward_server, monkeypatch):
    reward_server.token = "the-right-one"
    monkeypatch.setenv(ENV, TOKEN)
    with pytest.raises(RemoteRewardError) as caught:
        await remote(reward_server.url, token_env=ENV)(samples(1))
    message = str(caught.value)
    assert f"HTTP 401 Unauthorized (the bearer token from ${ENV} was refused)" in message
    assert "bad credentials Bearer <redacted>" in message  # the server echoed it back
    assert TOKEN not in message and TOKEN not in repr(caught.value)
    error: BaseException | None = caught.value
    while error is not None:  # nothing in the exception chain holds the token either
        assert TOKEN not in f"{error!s} {error!r} {vars(error)}"
        error = error.__cause__ or error.__context__
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


async def test_a_missing_token_variable_fails_at_construction(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ValueError, match=rf"environment variable {ENV} is not set or empty"):
        RemoteReward("http://127.0.0.1:9/score", token_env=ENV)


def test_urls_are_shown_without_query():
    source = RemoteReward("http://127.0.0.1:8080/v1/score?key=abc&mode=fast")
    assert source.url == "http://127.0.0.1:8080/v1/score?key=abc&mode=fast"  # sent as given
    assert source.display_url == "http://127.0.0.1:8080/v1/score"
    assert "abc" not in repr(source)


def test_credentials_in_the_url_are_refused_without_showing_them():
    with pytest.raises(ValueError) as caught:
        RemoteReward("http://user:pw-123@127.0.0.1:8080/v1/score?token=abc")
    assert str(caught.value) == (
        "RemoteReward URL 'http://***@127.0.0.1:8080/v1/score?token=***' has credentials in "
        "it (user:pass@), which are never sent; put the token in an environment variable and "
        "pass token_env='VARIABLE' (it goes in an Authorization: Bearer header)"
    )
    with pytest.raises(ValueError, match=r"got 'ftp://\*\*\*@x/y\?api_key=\*\*\*'"):
        RemoteReward("ftp://me:pw-123@x/y?api_key=abc")
    with pytest.raises(ValueError, match=r"with a host, got 'http://\*\*\*@\[::1'"):
        RemoteReward("http://me:pw-123@[::1")


def test_a_token_over_plain_http_to_another_host_warns_once_per_host(monkeypatch):
    monkeypatch.setenv(ENV, TOKEN)
    monkeypatch.setattr(remote_module, "_warned_plain_http", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            RemoteReward("http://rewards.example:8000/score", token_env=ENV)
        RemoteReward("http://10.0.0.7/score", token_env=ENV)
        RemoteReward("https://rewards.example/score", token_env=ENV)  # encrypted
        RemoteReward("http://other.example/score")  # no token sent
        for loopback in ("127.0.0.1", "127.0.0.2", "localhost", "[::1]", "api.localhost"):
            RemoteReward(f"http://{loopback}:9/score", token_env=ENV)
    assert [str(w.message) for w in caught] == [
        f"RemoteReward sends the bearer token from ${ENV} to {host} over plain http: anyone "
        "on the network path can read it; use an https:// URL"
        for host in ("rewards.example", "10.0.0.7")
    ]
    assert all(w.category is RuntimeWarning and w.filename == __file__ for w in caught)


async def test_secrets_a_server_echoes_in_urls_are_redacted(reward_server):
    reward_server.then(500, '{"error": "upstream https://bot:hunter2@up.example/x?sig=abc failed"}')
    with pytest.raises(RemoteRewardError) as caught:
        await remote(reward_server.url)(samples(1))
    message = str(caught.value)
    assert "upstream https://***@up.example/x?sig=*** failed" in message
    assert "hunter2" not in message and "abc" not in message


def test_construction_errors_are_precise():
    with pytest.raises(ValueError, match="needs an http\\(s\\) URL with a host, got 'ftp://x/y'"):
        RemoteReward("ftp://x/y")
    with pytest.raises(
        ValueError,
        match=r"timeout_s must be > 0, got 0; retries must be in "
        r"\[0, 20\], got -1",
    ):
        RemoteReward("http://127.0.0.1:9/", timeout_s=0, retries=-1)


async def test_unserialisable_examples_are_refused_before_sending(reward_server):
    bad = RewardSample(prompt="q", completion="c", example={"when": object()})
    with pytest.raises(
        TypeError,
        match=rf"sample 0 cannot be sent to {reward_server.url}: it is "
        r"not plain JSON",
    ):
        await remote(reward_server.url)([bad])
    assert reward_server.requests == []


async def test_a_recipe_routes_only_its_label_to_the_server(reward_server, dead_url):
    recipe = Recipe(
        {"chat": [("remote", 1.0)], "math": [("exact", 1.0)]},
        sources={"remote": remote(reward_server.url)},
    )
    mixed = [*samples(2), RewardSample("q", "Answer: 3", {"answer": 3}, label="math")]
    results = await recipe.score_many(mixed)
    assert [r.total for r in results] == [1.0, 2.0, 1.0]
    assert [len(r["body"]["items"]) for r in reward_server.requests] == [2]
    down = Recipe({"chat": [("rm", 1.0)]}, sources={"rm": remote(dead_url)})
    with pytest.raises(
        RewardError,
        match=rf"reward source 'rm': reward server {dead_url}: "
        "connection refused",
    ):
        await down.score_many(samples(1))
