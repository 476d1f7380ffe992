"""The trajectory browser's data: a compact summary of every trajectory, and the text of
a sample of them.

The summary (step, task, status, reward, length, turns, ids, policy version) is kept for
every trajectory, column by column, so filters and counts are exact for 10k+ rows. Text
is embedded for at most ``max_texts`` trajectories (whole groups, spread evenly over the
run) so the page stays small and opens fast: each is the decoded prompt and the
completion cut at the env mask into model and env segments; model segments keep one text
piece per token with its sampling logprob (x100, an integer) for colouring, and the
policy versions of their spans. Without the run's tokenizer the text comes from the
chat messages instead (no per-token view).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loomrl.report.load import Run, read_details
from loomrl.rundir import STEP_PREFIX, RunDir

Decode = Callable[[Sequence[int]], str]


def find_decoder(run: Run) -> Decode | None:
    """A decoder of the run's token ids, found without converting or downloading anything:
    a checkpoint's model directory, the model spec's local directory, or the named model
    when it is already prepared in the cache. ``None`` when no tokenizer loads.

    A ``tokenizer.json`` is read with the ``tokenizers`` library alone (importing
    transformers costs seconds); a directory without one goes through transformers."""
    from loomrl.models import NAMED, is_prepared, models_dir

    model = run.model or ""
    candidates = sorted(RunDir(run.path).checkpoints.glob(f"{STEP_PREFIX}*/model"))[-1:]
    if model in NAMED:
        name = model if model != "tiny-random" else "tiny-random-seed0"
        if is_prepared(name):
            candidates.append(models_dir() / name)
    elif model.startswith("tiny-random:"):
        name = f"tiny-random-seed{model.split(':', 1)[1]}"
        if is_prepared(name):
            candidates.append(models_dir() / name)
    elif model:
        candidates.append(Path(model).expanduser())
    for path in candidates:
        try:
            if (path / "tokenizer.json").is_file():
                from tokenizers import Tokenizer

                backend = Tokenizer.from_file(str(path / "tokenizer.json"))
                return lambda ids: backend.decode(list(ids), skip_special_tokens=False)
            if (path / "tokenizer_config.json").is_file():
                from transformers import AutoTokenizer

                slow = AutoTokenizer.from_pretrained(path)
                return lambda ids: slow.decode(list(ids), skip_special_tokens=False)
        except Exception:  # a broken tokenizer: the report falls back to messages
            continue
    return None


def pick(run: Run, budget: int) -> list[int]:
    """Rows whose text is embedded: whole groups, evenly spaced over the run's groups,
    until ``budget`` trajectories (a group is never split; at least one group)."""
    if budget <= 0 or run.trajectories.num_rows == 0:
        return []
    steps = run.trajectories.column("step").to_pylist()
    groups = run.trajectories.column("group_id").to_pylist()
    members: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(steps, groups, strict=True)):
        members.setdefault(key, []).append(i)
    keys = list(members)
    size = max(1, run.trajectories.num_rows // len(keys))
    wanted = max(1, min(len(keys), budget // size))
    chosen = sorted({round(k * (len(keys) - 1) / max(wanted - 1, 1)) for k in range(wanted)})
    return sorted(i for k in chosen for i in members[keys[k]])


def token_pieces(decode: Decode, ids: Sequence[int]) -> list[str]:
    """One text piece per token whose concatenation is ``decode(ids)`` (for byte-level
    tokenizers): a token that ends inside a multi-byte character gets ``""`` and the
    character goes to the token that completes it. Text is cut only where a chunk
    decodes cleanly, so the pieces always add up to the whole."""
    pieces, start = [], 0
    for i in range(len(ids)):
        text = decode(ids[start : i + 1])
        if text.endswith("\ufffd") and i + 1 < len(ids):
            pieces.append("")
            continue
        pieces.append(text)
        start = i + 1
    return pieces


def encode_tokens(row: dict[str, Any], decode: Decode) -> dict[str, Any]:
    """Prompt text and mask segments of one trajectory's tokens."""
    ids, mask, lps = row["completion_ids"], row["loss_mask"], row["logprobs"]
    starts, versions = row.get("span_starts") or [], row.get("span_versions") or []
    segments: list[list[Any]] = []
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and mask[j] == mask[i]:
            j += 1
        if mask[i]:
            spans = [v for s, v in zip(starts, versions, strict=False) if i <= s < j]
            scaled = [max(-9999, round(lp * 100)) for lp in lps[i:j]]
            segments.append([1, token_pieces(decode, ids[i:j]), scaled, spans])
        else:
            segments.append([0, decode(ids[i:j])])
        i = j
    return {"p": decode(row["prompt_ids"]), "s": segments}


def encode_messages(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Prompt and segments from chat messages (no tokenizer): assistant turns are model
    text, every other message after the first assistant turn is env text."""
    first = next((k for k, m in enumerate(messages) if m.get("role") == "assistant"), None)
    first = len(messages) if first is None else first
    prompt = "\n\n".join(f"{m.get('role')}: {_content(m)}" for m in messages[:first])
    segments: list[list[Any]] = []
    for m in messages[first:]:
        if m.get("role") == "assistant":
            segments.append([1, [_content(m)], None, []])
        else:
            segments.append([0, f"{m.get('role')}: {_content(m)}"])
    return {"p": prompt, "s": segments}


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    calls = message.get("tool_calls")
    return text + (f"\n[tool calls] {json.dumps(calls, ensure_ascii=False)}" if calls else "")


def browser_data(runs: Sequence[Run], max_texts: int) -> dict[str, Any]:
    """The browser's JSON: ``cols`` (one list per field, one entry per trajectory),
    ``envs``/``statuses`` (the codes ``cols`` uses), ``texts`` (embedded details) and
    ``text_of`` (per trajectory, its index in ``texts`` or -1)."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "run", "step", "env", "status", "reward", "len", "env_len", "turns", "group",
        "example", "sample", "version",
    )}  # fmt: skip
    envs: list[str] = []
    statuses: list[str] = []
    texts: list[dict[str, Any]] = []
    text_of: list[int] = []
    per_run = max_texts // max(len(runs), 1)
    tokenized = []
    for r, run in enumerate(runs):
        t = run.trajectories
        n = t.num_rows
        if n == 0:
            tokenized.append(False)
            continue
        cols["run"] += [r] * n
        cols["step"] += t.column("step").to_pylist()
        cols["env"] += [_code(envs, e) for e in t.column("env").to_pylist()]
        cols["status"] += [_code(statuses, s) for s in t.column("status").to_pylist()]
        rewards = t.column("reward").to_pylist()
        cols["reward"] += [None if v is None else round(v, 4) for v in rewards]
        cols["len"] += t.column("num_completion_tokens").to_pylist()
        cols["env_len"] += t.column("num_env_tokens").to_pylist()
        cols["turns"] += t.column("turns").to_pylist()
        cols["group"] += t.column("group_id").to_pylist()
        cols["example"] += t.column("example_id").to_pylist()
        cols["sample"] += t.column("sample_index").to_pylist()
        cols["version"] += t.column("policy_version").to_pylist()
        components = t.column("reward_components").to_pylist()
        chosen = pick(run, per_run)
        decode = find_decoder(run) if chosen else None
        tokenized.append(decode is not None)
        index = [-1] * n
        for i, row in zip(chosen, read_details(run, chosen), strict=True):
            messages = json.loads(row["messages"] or "[]")
            body = encode_tokens(row, decode) if decode else encode_messages(messages)
            body.update(x=json.loads(components[i] or "{}"), e=row.get("error"),
                        f=row.get("finish_reasons") or [],
                        r=row.get("turn_rewards") or [],
                        m=json.loads(row.get("env_metrics") or "{}"))  # fmt: skip
            index[i] = len(texts)
            texts.append(body)
        text_of += index
    return {
        "cols": cols, "envs": envs, "statuses": statuses, "texts": texts, "text_of": text_of,
        "tokenized": tokenized,
    }  # fmt: skip


def _code(codes: list[str], value: str) -> int:
    if value not in codes:
        codes.append(value)
    return codes.index(value)
