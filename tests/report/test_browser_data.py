"""The browser's data: token pieces that add up to the decoded text, mask segments that
match the trajectory's turns, whole groups embedded within the budget, and a fallback to
chat messages when the run's tokenizer cannot be found."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomrl.report import load_run
from loomrl.report.browser import browser_data, encode_messages, pick, token_pieces
from loomrl.report.load import read_details

TEXTS = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
) | st.sampled_from(["héllo wörld", "数学 🚀 test", "a\n\tb</script>", "ÿ€😀😀"])


@pytest.fixture(scope="module")
def decode(tokenizer):
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


@settings(max_examples=60, deadline=None)
@given(TEXTS)
def test_token_pieces_join_to_the_decoded_text(tokenizer, decode, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = token_pieces(decode, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == decode(ids)


def test_segments_follow_the_env_mask(rollout_dir, decode):
    data = browser_data([load_run(rollout_dir)], max_texts=100)
    run = load_run(rollout_dir)
    rows = read_details(run, list(range(run.trajectories.num_rows)))
    assert all(k >= 0 for k in data["text_of"])  # all 12 fit in the budget
    assert data["tokenized"] == [True]
    for i, row in enumerate(rows):
        body = data["texts"][data["text_of"][i]]
        model = [s for s in body["s"] if s[0] == 1]
        assert len(model) == run.trajectories.column("turns")[i].as_py()
        assert sum(len(s[1]) for s in model) == sum(row["loss_mask"])
        lps = [lp for s in model for lp in s[2]]
        want = [
            round(lp * 100) for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m
        ]
        assert lps == want
        assert "".join("".join(s[1]) if s[0] else s[1] for s in body["s"]) == decode(
            row["completion_ids"]
        )
        assert body["p"] == decode(row["prompt_ids"])
        assert all(s[3] == [0] for s in model)  # one span each, policy version 0


def test_env_text_is_the_env_reply(rollout_dir):
    data = browser_data([load_run(rollout_dir)], max_texts=100)
    env_text = [s[1] for t in data["texts"] for s in t["s"] if s[0] == 0]
    assert any("higher" in t or "lower" in t for t in env_text)


def test_pick_embeds_whole_groups_within_the_budget(train_dirs):
    run = load_run(train_dirs[0])  # 3 steps x 2 groups x 2 samples
    keys = list(zip(run.trajectories.column("step").to_pylist(),
                    run.trajectories.column("group_id").to_pylist(), strict=True))  # fmt: skip
    for budget, groups in ((0, 0), (1, 1), (4, 2), (5, 2), (6, 3), (100, 6)):
        chosen = pick(run, budget)
        assert len({keys[i] for i in chosen}) == groups
        assert all(keys.count(keys[i]) == sum(keys[j] == keys[i] for j in chosen) for i in chosen)
    spread = {keys[i][0] for i in pick(run, 6)}
    assert spread == {1, 2, 3}  # spread over the run, not its first groups


def test_without_a_tokenizer_text_comes_from_the_messages(rollout_dir, copy_of):
    run_dir = copy_of(rollout_dir)
    config = (run_dir / "config.toml").read_text()
    (run_dir / "config.toml").write_text(
        config.replace('model = "smollm2-135m-instruct"', f'model = "{run_dir / "gone"}"')
    )
    data = browser_data([load_run(run_dir)], max_texts=3)
    assert data["tokenized"] == [False]
    body = data["texts"][0]
    assert body["s"][0][0] == 1 and body["s"][0][2] is None
    assert body["s"][0][1][0].startswith("My guess is")


def test_tool_calls_are_kept_in_message_text():
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "calc", "args": "2+2"}]},
        {"role": "tool", "content": "4"},
    ]
    body = encode_messages(messages)
    assert body["p"] == "user: 2+2?"
    assert body["s"][0][0] == 1 and "[tool calls]" in body["s"][0][1][0]
    assert body["s"][1] == [0, "tool: 4"]
    json.dumps(body)


def test_per_turn_rewards_and_env_counts_travel_with_each_text(rollout_dir):
    data = browser_data([load_run(rollout_dir)], max_texts=100)
    run = load_run(rollout_dir)
    rows = read_details(run, list(range(run.trajectories.num_rows)))
    for i, row in enumerate(rows):
        body = data["texts"][data["text_of"][i]]
        assert body["r"] == row["turn_rewards"]
        assert body["m"] == json.loads(row["env_metrics"])
        assert len(body["r"]) >= 1  # guess_number answers every turn it is asked
