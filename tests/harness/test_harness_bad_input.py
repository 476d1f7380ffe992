"""What a harness endpoint does with bad input and badly behaved programs: malformed
requests get OpenAI-style 400s (counted), wrong keys a 401, late or concurrent requests
a 409; a program that raises, hangs, never asks or exits non-zero ends its episode with
a status that says so, and a command leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx
import psutil
import pytest

from loomrl import Status, rollout
from loomrl.harness import HarnessEnv, HarnessOutcome, ProgramExit

EXAMPLE = {"id": 0, "question": "2+3?"}
GOOD = {"model": "loomrl", "messages": [{"role": "user", "content": "2+3?"}]}


def root(run) -> str:
    """The server's own address (the session URL is ROOT/sessions/KEY/v1)."""
    return run.base_url.split("/sessions/")[0]


async def post(run, body=None, *, url=None, key=None, content=None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {run.api_key if key is None else key}"}
    if content is not None:
        headers["Content-Type"] = "application/json"
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(
            url or f"{run.base_url}/chat/completions",
            json=None if content is not None else body,
            content=content,
            headers=headers,
        )


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


async def no_process(pid: int, wait_s: float = 2.0) -> bool:
    """True once ``pid`` is gone (or a zombie nobody has reaped: it runs nothing)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)


# -- requests ---------------------------------------------------------------------------------
async def test_malformed_requests_get_400s_and_are_counted(make_engine):
    responses = {}

    async def agent(run):
        responses["no messages"] = await post(run, {"model": "loomrl"})
        responses["n"] = await post(run, {**GOOD, "n": 2})
        responses["param"] = await post(run, {**GOOD, "logit_bias": {"1": 5}})
        responses["json"] = await post(run, content=b'{"messages": [')
        responses["good"] = await post(run, GOOD)
        return 1.0

    env = HarnessEnv(agent)
    (traj,) = await rollout(make_engine(["5"]), env, [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.env_metrics["harness/bad_requests"] == 4
    assert traj.env_metrics["harness/requests"] == 1
    assert responses.pop("good").status_code == 200
    params = {"no messages": "messages", "n": "n", "param": "logit_bias", "json": None}
    for what, response in responses.items():
        assert response.status_code == 400, what
        error = error_of(response)
        assert error["type"] == "invalid_request_error" and error["param"] == params[what]
        assert error["message"]
    assert "not JSON" in error_of(responses["json"])["message"]


async def test_keys_route_sessions_and_a_wrong_key_is_refused(make_engine):
    responses = {}

    async def agent(run):
        url = f"{root(run)}/v1/chat/completions"
        responses["wrong"] = await post(run, GOOD, url=url, key="wrong")
        async with httpx.AsyncClient() as http:
            responses["models"] = await http.get(f"{root(run)}/v1/models")
            responses["session models"] = await http.get(f"{run.base_url}/models")
            responses["api-key"] = await http.post(url, json=GOOD, headers={"api-key": "nope"})
        responses["bearer"] = await post(run, GOOD, url=url)  # the key alone names it
        return 1.0

    env = HarnessEnv(agent, model="policy-7")
    (traj,) = await rollout(make_engine(["5"]), env, [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    for what in ("wrong", "api-key"):
        assert responses[what].status_code == 401
        error = error_of(responses[what])
        assert error["code"] == "invalid_api_key" and "unknown session key" in error["message"]
    assert traj.env_metrics["harness/bad_requests"] == 0  # no session to count them in
    for what in ("models", "session models"):
        assert responses[what].status_code == 200
        assert [m["id"] for m in responses[what].json()["data"]] == ["policy-7"]
    assert responses["bearer"].status_code == 200
    assert responses["bearer"].json()["model"] == "policy-7"


async def test_a_request_to_an_ended_episode_gets_409(make_engine):
    keys: dict[int, object] = {}
    late: list[httpx.Response] = []
    env = None

    async def agent(run):
        keys[run.example["id"]] = run
        if run.example["id"] == 1:  # ask the first episode's session once it has ended
            while 0 not in keys or keys[0].api_key in env.server.sessions:
                await asyncio.sleep(0.005)
            late.append(await post(keys[0], GOOD))
        await post(run, GOOD)
        return 1.0

    env = HarnessEnv(agent)
    out = await rollout(make_engine(["5", "5"]), env, [{"id": 0}, {"id": 1}], on_error="isolate")
    assert [t.status for t in out] == [Status.TERMINATED] * 2, [t.error for t in out]
    (response,) = late
    assert response.status_code == 409, response.text
    assert error_of(response)["code"] == "episode_ended"


async def test_concurrent_requests_in_one_session_get_409(make_engine):
    responses = []
    other = {**GOOD, "messages": [{"role": "user", "content": "3+4?"}]}

    async def agent(run):
        responses.extend(await asyncio.gather(post(run, GOOD), post(run, other)))
        return 1.0

    (traj,) = await rollout(make_engine(["5"]), HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    assert sorted(r.status_code for r in responses) == [200, 409]
    (refused,) = [r for r in responses if r.status_code == 409]
    assert error_of(refused)["code"] == "concurrent_request"
    assert refused.headers["x-should-retry"] == "false"  # OpenAI SDKs would retry a 409


async def test_a_retried_request_gets_the_same_answer_not_a_new_turn(make_engine):
    """An SDK retries a request it lost (a timeout) or sends it twice: the repeat shares
    the open request's answer, or gets the last answer again; no turn is sampled for it."""
    answers = []

    async def agent(run):
        twice = await asyncio.gather(post(run, GOOD), post(run, GOOD))  # at once
        again = await post(run, GOOD)  # after the answer: a retry of a lost response
        answers.extend(r.json()["choices"][0]["message"] for r in [*twice, again])
        return 1.0

    engine = make_engine(["5", "6", "7"])
    (traj,) = await rollout(engine, HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.turns == 1 and not traj.segments
    assert [a["content"] for a in answers] == ["5", "5", "5"]
    assert traj.env_metrics["harness/requests"] == 1
    assert traj.env_metrics["harness/resends"] == 2


async def test_max_turns_answers_the_pending_request_and_kills_the_program(make_engine):
    pending: list[asyncio.Task] = []
    killed: list[bool] = []
    outcomes: list[HarnessOutcome] = []

    async def agent(run):
        first = (await post(run, GOOD)).json()["choices"][0]["message"]
        again = {**GOOD, "messages": [*GOOD["messages"], first, {"role": "user", "content": "?"}]}
        pending.append(asyncio.ensure_future(post(run, again)))  # outlives the program
        try:
            await asyncio.shield(pending[0])
        except asyncio.CancelledError:
            killed.append(True)
            raise
        return 1.0

    env = HarnessEnv(agent, max_turns=1, reward=lambda o: outcomes.append(o) or 0.5)
    (traj,) = await rollout(make_engine(["5"]), env, [EXAMPLE], on_error="isolate")
    assert traj.status == Status.MAX_TURNS, traj.error
    assert traj.reward == 0.5 and traj.turns == 1
    assert outcomes[0].finished is False and outcomes[0].result is None
    response = await asyncio.wait_for(pending[0], 5)
    assert response.status_code == 409
    assert error_of(response)["code"] == "episode_ended"
    assert killed == [True]
    assert not env.server.listening and not env.server.sessions


# -- programs ---------------------------------------------------------------------------------
async def test_a_harness_that_raises_is_an_error_naming_it(make_engine):
    async def agent(run):
        if run.example["id"] == 1:
            await post(run, GOOD)
        raise ValueError("boom")

    env = HarnessEnv(agent)
    out = await rollout(make_engine(["5"]), env, [{"id": 0}, {"id": 1}], on_error="isolate")
    assert [t.status for t in out] == [Status.ERROR] * 2
    raised = "HarnessError: the harness raised ValueError: boom"
    assert [t.error for t in out] == [f"{raised} (before its first request)", raised]
    assert [t.turns for t in out] == [0, 1]
    assert not env.server.listening and not env.server.sessions


async def test_a_harness_that_hangs_times_out(make_engine):
    async def agent(run):
        if run.example["id"] == 1:
            await post(run, GOOD)
        await asyncio.sleep(3600)

    env = HarnessEnv(agent, timeout=0.5)
    started = time.perf_counter()
    out = await rollout(make_engine(["5"]), env, [{"id": 0}, {"id": 1}], on_error="isolate")
    assert time.perf_counter() - started < 3.0  # not the hour it asked for
    assert [t.status for t in out] == [Status.ENV_TIMEOUT] * 2
    assert all("ran past its timeout=0.5s" in t.error for t in out)
    assert out[1].turns == 1
    assert not env.server.listening and not env.server.sessions


async def test_a_harness_that_never_asks_is_an_error(make_engine):
    async def agent(run):
        return 1.0

    (traj,) = await rollout(make_engine([]), HarnessEnv(agent), [EXAMPLE], on_error="isolate")
    assert traj.status == Status.ERROR
    assert "the harness ended before its first request" in traj.error


OPENAI_SCRIPT = """
import json, os, sys
from openai import OpenAI
example = json.load(sys.stdin)
assert json.loads(os.environ["LOOMRL_EXAMPLE"]) == example
client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY
reply = client.chat.completions.create(
    model=os.environ["OPENAI_MODEL"],
    messages=[{"role": "user", "content": example["question"]}],
)
print("the model said", reply.choices[0].message.content)
print(json.dumps({"reward": float("5" in reply.choices[0].message.content)}))
"""


async def test_a_command_harness_uses_the_openai_environment(make_engine, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(OPENAI_SCRIPT)
    env = HarnessEnv(command=[sys.executable, str(script)], timeout=30)
    (traj,) = await rollout(make_engine(["It is 5."]), env, [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    assert traj.reward == 1.0
    assert traj.messages == [
        {"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "It is 5."}
    ]  # fmt: skip
    assert not env.server.listening


async def test_a_commands_exit_is_what_the_reward_function_sees(make_engine, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(OPENAI_SCRIPT)
    results = []
    env = HarnessEnv(
        command=[sys.executable, str(script)], reward=lambda o: results.append(o.result) or 0.0
    )
    (traj,) = await rollout(make_engine(["no idea"]), env, [EXAMPLE], on_error="isolate")
    assert traj.status == Status.TERMINATED, traj.error
    (result,) = results
    assert isinstance(result, ProgramExit) and result.returncode == 0
    assert result.stdout.splitlines()[0] == "the model said no idea"
    assert result.reported() == {"reward": 0.0}


URLLIB_ASK = """
import json, os, sys, urllib.request
def ask():
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    return json.loads(urllib.request.urlopen(request).read())
"""


@pytest.mark.parametrize("asks", [False, True])
async def test_a_command_that_fails_is_an_error_with_its_code_and_stderr(
    make_engine, tmp_path, asks
):
    script = tmp_path / "agent.py"
    body = "ask()\n" if asks else ""
    script.write_text(URLLIB_ASK + body + "sys.stderr.write('disk on fire\\n')\nsys.exit(3)\n")
    env = HarnessEnv(command=[sys.executable, str(script)], timeout=30)
    (traj,) = await rollout(make_engine(["ok"]), env, [EXAMPLE], on_error="isolate")
    assert traj.status == Status.ERROR
    failed = "HarnessError: the harness command exited with code 3: disk on fire"
    assert traj.error == (failed if asks else f"{failed} (before its first request)")
    assert traj.turns == int(asks)


HANGS = """
import json, os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
with open(sys.argv[1], "w") as f:
    json.dump([os.getpid(), child.pid], f)
{then}
time.sleep(60)
"""


@pytest.mark.parametrize("asks", [False, True])
async def test_a_command_that_hangs_is_killed_with_its_children(make_engine, tmp_path, asks):
    script, pids = tmp_path / "agent.py", tmp_path / "pids.json"
    script.write_text(URLLIB_ASK + HANGS.format(then="ask()" if asks else ""))
    # -S: no site-packages, so the program starts (and writes its pids) well in time.
    env = HarnessEnv(command=[sys.executable, "-S", str(script), str(pids)], timeout=1.5)
    started = time.perf_counter()
    (traj,) = await rollout(make_engine(["ok"]), env, [EXAMPLE], on_error="isolate")
    assert time.perf_counter() - started < 5.0
    assert traj.status == Status.ENV_TIMEOUT, traj.error
    assert "ran past its timeout=1.5s" in traj.error
    assert traj.turns == int(asks)
    for pid in json.loads(pids.read_text()):
        assert await no_process(pid), f"process {pid} outlived its episode"


async def test_a_command_that_leaves_a_child_behind_still_ends_and_the_child_is_killed(
    make_engine, tmp_path
):
    # The command answers and exits 0, but a child it started (a tool server, say) still
    # holds its stdout: the episode ends with the command, and the child goes with it.
    script, pids = tmp_path / "agent.py", tmp_path / "pids.json"
    script.write_text(
        URLLIB_ASK + HANGS.format(then="ask()\nprint(json.dumps({'reward': 1}))\nsys.exit(0)")
    )
    env = HarnessEnv(command=[sys.executable, "-S", str(script), str(pids)], timeout=1.5)
    (traj,) = await rollout(make_engine(["ok"]), env, [EXAMPLE], on_error="isolate")
    leftover = [pid for pid in json.loads(pids.read_text()) if not await no_process(pid, 0.5)]
    for pid in leftover:  # the test's own cleanup: never leave the sleeper running
        psutil.Process(pid).kill()
    # Both at once, so a failure shows the hang and the leak together.
    assert (traj.status, traj.error, leftover) == (Status.TERMINATED, None, [])
    assert traj.reward == 1.0


DAEMON = """
import json, subprocess, sys
# A daemon leaves the command's process group (setsid) and is not its child any more.
child = subprocess.Popen(
    [sys.executable, "-S", "-c", "import time; time.sleep(60)"], start_new_session=True,
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
with open(sys.argv[1], "w") as f:
    json.dump([child.pid], f)
ask()
print(json.dumps({"reward": 1}))
"""


async def test_a_process_that_left_the_group_is_killed_too(make_engine, tmp_path):
    script, pids = tmp_path / "agent.py", tmp_path / "pids.json"
    script.write_text(URLLIB_ASK + DAEMON)
    env = HarnessEnv(command=[sys.executable, "-S", str(script), str(pids)], timeout=30)
    (traj,) = await rollout(make_engine(["ok"]), env, [EXAMPLE], on_error="isolate")
    (daemon,) = json.loads(pids.read_text())
    gone = await no_process(daemon, 2.0)
    if not gone:
        psutil.Process(daemon).kill()  # never leave the sleeper running
    assert (traj.status, traj.reward, gone) == (Status.TERMINATED, 1.0, True)
