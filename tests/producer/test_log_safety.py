"""Opening a buffer log never runs code: rows are data (JSON), and anything else (a
pickle, garbage bytes or text, an old pickle-format log, a file that is not SQLite, a
trigger) is refused with an error naming the file and the group/sample. Records
round-trip exactly, floats bit for bit, tuples as tuples."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import re
import sqlite3
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_buffer import add_group, complete, make_traj

from loomrl.envs.base import Environment, EnvState, check_plain
from loomrl.producer import GroupStatus, ReplayBuffer, Sample
from loomrl.producer.log import BufferLog, BufferLogError, read_log
from loomrl.producer.records import _READERS, TOKEN_FIELDS, traj_from_row, traj_to_row
from loomrl.types import Status, Trajectory


class Payload:
    """Unpickling this creates ``marker``: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def make_log(path, consumed: bool = True) -> None:
    """A log with a consumed group 0 (on disk only) and a pending group 1 (in memory)."""
    buffer = ReplayBuffer(path)
    first = add_group(buffer)
    complete(buffer, first)
    if consumed:
        buffer.get(1, step=0)
    second = add_group(buffer)
    state = EnvState([{"role": "user", "content": "q"}], second.example)
    buffer.checkpoint(second, 0, Sample(make_traj(1, 0), state, stop=("x",)))
    buffer.close()


def poke(path, sql: str, *args) -> None:
    db = sqlite3.connect(path)
    with db:
        db.execute(sql, args)
    db.close()


@pytest.mark.parametrize("column", ["traj", "state", "stop"])
@pytest.mark.parametrize("gid", [0, 1])  # a consumed group (on disk only), a pending one
def test_a_pickle_in_a_row_is_refused_and_never_run(tmp_path, column, gid):
    path, marker = tmp_path / "buffer.sqlite", tmp_path / "ran"
    make_log(path)
    payload = pickle.dumps(Payload(str(marker)))
    poke(path, f"UPDATE samples SET {column}=? WHERE group_id=?", payload, gid)
    where = re.escape(str(path))
    with pytest.raises(BufferLogError, match=rf"^{where}: group {gid} sample 0 is not JSON"):
        ReplayBuffer(path)
    with pytest.raises(BufferLogError, match=re.escape(str(path))):
        read_log(path)
    assert not marker.exists()


def test_garbage_bytes_and_text_are_refused(tmp_path):
    path = tmp_path / "buffer.sqlite"
    make_log(path)
    poke(path, "UPDATE samples SET traj=? WHERE group_id=1", os.urandom(64))
    with pytest.raises(BufferLogError, match="group 1 sample 0 is not JSON text"):
        ReplayBuffer(path)
    poke(path, "UPDATE samples SET traj=? WHERE group_id=1", "\x80(not json")
    with pytest.raises(BufferLogError, match="group 1 sample 0 is not JSON text"):
        ReplayBuffer(path)


def test_a_row_of_the_wrong_shape_names_its_field(tmp_path):
    path = tmp_path / "buffer.sqlite"
    make_log(path)
    bad = '{"example_id":1,"group_id":1,"sample_index":0,"env":"t","span_versions":["x"]}'
    poke(path, "UPDATE samples SET traj=? WHERE group_id=1", bad)
    with pytest.raises(BufferLogError, match=r"group 1 .*'span_versions': expected an integer"):
        ReplayBuffer(path)  # a pending group: read when the buffer opens
    # A consumed group is read when asked for, with the same kind of error.
    make_log(path := tmp_path / "other.sqlite")
    poke(path, "UPDATE samples SET traj=? WHERE group_id=0", bad.replace('"group_id":1', '"x":1'))
    buffer = ReplayBuffer(path)
    with pytest.raises(BufferLogError, match=r"group 0 sample 0 .*unknown trajectory fields"):
        buffer.trajectories()
    buffer.close()
    poke(path, "UPDATE groups SET example='[1]' WHERE group_id=1")
    with pytest.raises(BufferLogError, match="group 1 has a malformed row: its example is a list"):
        ReplayBuffer(path)
    poke(path, "UPDATE groups SET status='exploded' WHERE group_id=1")
    with pytest.raises(BufferLogError, match="group 1 has a malformed row"):
        ReplayBuffer(path)


def test_an_old_pickle_format_log_is_refused_unread(tmp_path):
    path, marker = tmp_path / "buffer.sqlite", tmp_path / "ran"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE groups (group_id INTEGER PRIMARY KEY, task TEXT NOT NULL,
            example_index INTEGER NOT NULL, example TEXT NOT NULL, n INTEGER NOT NULL,
            status TEXT NOT NULL, attempts INTEGER NOT NULL, consumed_step INTEGER,
            tail INTEGER NOT NULL, note TEXT NOT NULL);
        CREATE TABLE samples (group_id INTEGER NOT NULL, sample_index INTEGER NOT NULL,
            data BLOB NOT NULL, PRIMARY KEY (group_id, sample_index));
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO groups VALUES (0, 'a', 0, '{}', 2, 'pending', 0, NULL, 0, '');
        """
    )
    db.execute("INSERT INTO samples VALUES (0, 0, ?)", (pickle.dumps(Payload(str(marker))),))
    db.commit()
    db.close()
    old = rf"^{re.escape(str(path))} was written by an older loomrl .*pickle"
    with pytest.raises(BufferLogError, match=old):
        ReplayBuffer(path)
    assert not marker.exists()
    poke(path, "INSERT INTO meta VALUES ('format', '3')")
    with pytest.raises(BufferLogError, match="has log format '3'; this loomrl reads format 2"):
        ReplayBuffer(path)


def test_a_file_that_is_not_a_log_is_refused(tmp_path):
    path = tmp_path / "buffer.sqlite"
    path.write_bytes(b"\x80\x04not a database at all" * 100)
    where = re.escape(str(path))
    with pytest.raises(BufferLogError, match=rf"^{where}: not a readable buffer log"):
        ReplayBuffer(path)
    other = tmp_path / "other.sqlite"
    poke(other, "CREATE TABLE t (x)")
    with pytest.raises(BufferLogError, match=r"not a buffer log \(tables \['t'\]"):
        ReplayBuffer(other)
    make_log(path := tmp_path / "trigger.sqlite")
    poke(path, "CREATE TRIGGER t AFTER INSERT ON groups BEGIN DELETE FROM meta; END")
    with pytest.raises(BufferLogError, match="a buffer log has no trigger 't'"):
        ReplayBuffer(path)
    with pytest.raises(BufferLogError):
        read_log(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()  # reading never creates a log


def test_bad_progress_is_named(tmp_path):
    path = tmp_path / "buffer.sqlite"
    make_log(path)
    poke(path, "UPDATE meta SET value='{\"tasks\": [1]}' WHERE key='progress'")
    with pytest.raises(BufferLogError, match="meta 'progress' is not a progress record"):
        ReplayBuffer(path)


def rich_traj() -> Trajectory:
    """Every field set, with values that would not survive a careless codec."""
    return Trajectory(
        example_id=7, group_id=3, sample_index=1, env="tools", prompt_ids=[1, 2, 3],
        completion_ids=[5, 6, 7, 8, 9], logprobs=[-0.1, -2.220446049250313e-16, 0.0, 0.0, -5e-324],
        loss_mask=[1, 1, 0, 0, 1], spans=[(0, 2), (4, 5)], span_versions=[2, 3],
        finish_reasons=["abort", "stop"], turns=2, status=Status.MAX_TURNS,
        reward=0.1 + 0.2, reward_components={"exact": 0.30000000000000004, "fmt": -0.0},
        turn_rewards=[None, 0.5], error="boom \u2603 \ud800", timings={"env_s": 1e-9},
        messages=[{"role": "user", "content": "snow \u2603"}, {"role": "tool", "name": "x",
                  "content": "", "extra": {"a": [1, None, True]}}],
    )  # fmt: skip


def test_every_trajectory_field_round_trips_exactly(tmp_path):
    traj = rich_traj()
    assert {f.name for f in dataclasses.fields(Trajectory)} == _READERS.keys() | {*TOKEN_FIELDS}
    back = traj_from_row(*traj_to_row(traj))
    assert back == traj
    assert all(type(s) is tuple for s in back.spans) and type(back.status) is Status
    assert math.copysign(1, back.reward_components["fmt"]) == -1  # -0.0 kept
    # Through the log, with the sample's stop tuple, done flag and env state.
    log = BufferLog(tmp_path / "log.sqlite")
    state = EnvState([{"role": "user", "content": "q"}], {"id": 7}, [{"type": "function"}], 2,
                     {"tries": [1, 2], "seen": {"a": 1.5}})  # fmt: skip
    log.save_group(add_group(ReplayBuffer(), "t"))
    assert log.save_sample(0, 1, Sample(traj, state, ("</a>", "\n"), done=True)) is None
    ((loaded,),) = [g.samples.values() for g in log.load_groups()]
    assert loaded == Sample(traj, state, ("</a>", "\n"), True)
    log.close()


def test_non_finite_floats_are_kept_and_the_json_stays_standard():
    traj = rich_traj()
    traj.logprobs = [-math.inf, -0.0, math.nan, -1.0, math.inf]
    traj.reward, traj.timings, traj.turn_rewards = math.nan, {"x": -math.inf}, [math.inf]
    text, tokens = traj_to_row(traj)

    def refuse(token):
        raise AssertionError(f"{token} in the JSON")

    json.loads(text, parse_constant=refuse)  # no NaN / Infinity tokens: standard JSON
    back = traj_from_row(text, tokens)
    bits = [struct.pack("<d", x) for x in back.logprobs]
    assert bits == [struct.pack("<d", x) for x in traj.logprobs]  # the same IEEE-754 bits
    assert math.isnan(back.reward) and back.turn_rewards == [math.inf]
    assert back.timings == {"x": -math.inf}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(), max_size=50), st.floats(allow_nan=False))
def test_floats_round_trip_bit_for_bit(logprobs, reward):
    traj = Trajectory(0, 0, 0, "e", logprobs=logprobs, reward=reward)
    back = traj_from_row(*traj_to_row(traj))
    bits = lambda xs: [struct.pack("<d", x) for x in xs]  # noqa: E731
    assert bits(back.logprobs) == bits(logprobs) and bits([back.reward]) == bits([reward])


def test_packed_token_arrays_are_checked_against_their_header(tmp_path):
    path, marker = tmp_path / "buffer.sqlite", tmp_path / "ran"
    make_log(path)
    poke(path, "UPDATE samples SET tokens=? WHERE group_id=1", pickle.dumps(Payload(str(marker))))
    with pytest.raises(BufferLogError, match="group 1 sample 0 cannot be read: the token arrays"):
        ReplayBuffer(path)
    make_log(path := tmp_path / "other.sqlite")
    _, tokens = traj_to_row(make_traj(0, 0))
    poke(path, "UPDATE samples SET tokens=? WHERE group_id=0", tokens[:-1])
    buffer = ReplayBuffer(path)  # group 0 is consumed: read when asked for
    with pytest.raises(BufferLogError, match=r"group 0 sample 0 .* header \[3, 3, 3, 3\] says"):
        buffer.trajectories()
    buffer.close()
    assert not marker.exists()
    with pytest.raises(OverflowError):
        traj_to_row(Trajectory(0, 0, 0, "e", prompt_ids=[2**31]))  # ids are int32


def test_the_default_state_hooks_take_plain_data_only():
    env = Environment.__new__(type("E", (Environment,), {"score": lambda self, s: 0.0}))
    state = EnvState([{"role": "user", "content": "q"}], {"id": 1}, data={"n": [1, 2.5]})
    assert env.load_state_dict(env.state_dict(state)) == state
    for bad, where in [
        ({"pair": (1, 2)}, "state.data['pair'] is a tuple"),
        ({"s": {1}}, "state.data['s'] is a set"),
        ({"k": {1: "a"}}, "state.data['k'] has a key 1"),
        ({"e": Status.ERROR}, "state.data['e'] is a Status"),
    ]:
        with pytest.raises(TypeError, match=where.replace("[", r"\[")):
            env.state_dict(EnvState([], {}, data=bad))
    with pytest.raises(ValueError, match=r"state\.turn must be an integer"):
        env.load_state_dict({"messages": [], "example": {}, "tools": None, "turn": "1",
                             "data": {}})  # fmt: skip
    with pytest.raises(ValueError, match="has the fields"):
        env.load_state_dict({"messages": []})
    check_plain([{"a": [None, True, 1, 1.5, "s"]}])  # passes


def test_a_finished_group_is_logged_without_env_states(tmp_path):
    buffer = ReplayBuffer(tmp_path / "log.sqlite")
    complete(buffer, add_group(buffer))
    assert all(s.state is not None for s in buffer.groups[0].samples.values())  # in memory
    log = BufferLog(tmp_path / "log.sqlite", readonly=True)
    (group,) = log.load_groups([GroupStatus.COMPLETED])
    assert all(s.state is None for s in group.samples.values())  # no sample of it runs again
    log.close()
    buffer.close()
