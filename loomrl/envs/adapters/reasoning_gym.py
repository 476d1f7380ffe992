"""``reasoning_gym:TASK``: any reasoning-gym task as a single-turn environment, scored by
the task's own ``score_answer``.

env_args are the task's dataset config fields (``size``, ``seed`` and its difficulty
knobs, e.g. ``min_digits``), checked against its config class (names, types, its own
``validate``) when the environment is built, which the CLI does before any engine
starts; plus ``format_weight``, ``system_prompt`` and ``few_shot`` (solved entries shown
as earlier turns: small models copy the answer format from them, not from the system
prompt). ``reasoning_gym:composite`` mixes tasks by weight, each with its own config:
``tasks = {basic_arithmetic = 1, leg_counting = {weight = 2, max_animals = 4}}``.

Examples: the first ``size`` are the entries of the task's dataset under ``seed``
(exactly ``reasoning_gym.create_dataset(task, seed=seed, size=size)[i]``); each next
``size`` come from a fresh seed derived from ``(seed, i // size)`` (reseeding, as
reasoning-gym's ``ReseedingDataset`` does, but with seeds that do not run into those of
the run with seed + 1), so a prefix never depends on ``n`` and ``--examples`` may exceed
``size``.
An example keeps ``question``, ``answer``, ``task`` (a composite's member task),
``metadata`` as plain JSON, ``entry`` = ``{"seed", "index"}`` (where it came from) and,
with ``few_shot``, ``shots`` (the same solved entries for every example).

Scoring: the reply's last ``<answer>...</answer>`` (reasoning-gym's ``extract_answer``)
goes to the task's ``score_answer`` with the entry *regenerated* from ``entry``, because
JSON does not give metadata back as the task made it (tuples come back as lists, and
some scorers compare tuples). Where regeneration gives another question (a few tasks
depend on Python's hash seed, so another process may generate another entry) or the
example has no ``entry`` (examples from a file), the example's own ``answer`` and
``metadata`` are the entry. Component ``correct`` is that score clipped to [0, 1]; a
scorer that raises on the reply scores 0. ``format`` (only when ``format_weight`` > 0)
is ``format_weight`` when the reply has an answer block. Scorers are arbitrary code, so
``score`` runs in the env thread pool (``nonblocking`` stays False), under ``env_timeout``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import random
import threading
from typing import Any

from loomrl.envs.adapters.rg_config import build_config, check_name, reason
from loomrl.envs.base import Environment, EnvState, EnvStep, Message
from loomrl.lru import LRUCache

DESCRIPTION = (
    "reasoning-gym tasks by name (100+ procedural generators scored by the task's own "
    "score_answer; env_args go to the task's config; `loomrl envs reasoning_gym` lists them)"
)
MAX_ANSWER_CHARS = 10_000
"""A longer answer block scores 0 without reaching the task's scorer (bounds its cost)."""
_ANSWER_CLOSE = "</answer>"


class MissingExtra(ImportError, ValueError):
    """The optional package an adapter needs is not installed (also a ``ValueError``: the
    command line reports it as one line, like other bad input)."""


def _rg() -> Any:
    """The ``reasoning_gym`` package, imported on first use (about 2 s: it imports sympy)."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise MissingExtra(
            f"reasoning_gym environments need the reasoning-gym package ({exc}): "
            "pip install 'loomrl[envs]'"
        ) from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every task reasoning-gym registers (``composite`` included), sorted."""
    return sorted(_rg().factory.DATASETS)


def check_task(task: str) -> None:
    """Raise ``ValueError`` naming close matches when reasoning-gym has no task ``task``."""
    check_name(task, _rg().factory.DATASETS)


def answer_of(text: str) -> str | None:
    """The last ``<answer>...</answer>`` block's content, as reasoning-gym's
    ``extract_answer`` reads it; None when there is none. Linear in ``len(text)``: the
    text past the last closing tag cannot hold a block, and cutting it leaves every
    opening tag a closing one to stop at (the library's regex, given many unclosed
    opening tags, rescans the rest of the text once per tag)."""
    end = text.rfind(_ANSWER_CLOSE)
    if end < 0:
        return None
    return _rg().utils.extract_answer(text[: end + len(_ANSWER_CLOSE)])


def system_prompt_of(value: str) -> str:
    """One of reasoning-gym's ``SYSTEM_PROMPTS`` by name, or a prompt of one's own; the
    latter must ask for ``<answer>`` (scoring reads the answer there: a typo'd name would
    otherwise become the prompt)."""
    prompts = _rg().utils.SYSTEM_PROMPTS
    if value in prompts:
        return prompts[value]
    if "<answer>" in value:
        return value
    raise ValueError(
        f"system_prompt {value[:60]!r} is neither a reasoning-gym prompt name "
        f"({', '.join(prompts)}) nor a prompt that asks for <answer>...</answer>"
    )


def chunk_seed(seed: int, chunk: int) -> int:
    """The dataset seed of examples ``chunk * size`` .. ``(chunk + 1) * size - 1``: ``seed``
    itself first, then a 32-bit seed drawn from the pair (stable across processes)."""
    return seed if chunk == 0 else random.Random(f"reasoning_gym/{seed}/{chunk}").getrandbits(32)


def plain(value: Any) -> Any:
    """``value`` as plain JSON data: tuples and sets become lists, keys strings, numpy
    numbers Python numbers, non-finite floats and other objects their ``str``."""
    if type(value) in (str, int, bool, type(None)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((plain(v) for v in value), key=repr)
    if isinstance(value, str):  # a str enum: its value, not its name
        return str.__str__(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Rational):
        number = float(value)
        return number if math.isfinite(number) else str(number)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return plain(value.tolist())
    return str(value)


class ReasoningGymEnv(Environment):
    """One reasoning-gym task (or a ``composite`` mix), single-turn: the model answers in
    ``<answer>`` tags and the task's own scorer grades the answer."""

    max_turns = 1

    def __init__(
        self,
        task: str,
        *,
        format_weight: float = 0.0,
        system_prompt: str = "default",
        few_shot: int = 0,
        tasks: dict[str, Any] | None = None,
        **config: Any,
    ) -> None:
        check_task(task)
        if not math.isfinite(format_weight):
            raise ValueError(f"format_weight must be finite, got {format_weight}")
        if few_shot < 0:
            raise ValueError(f"few_shot must be >= 0, got {few_shot}")
        self.name, self.task, self.format_weight = f"reasoning_gym:{task}", task, format_weight
        self.few_shot = few_shot
        self.system_prompt = system_prompt_of(system_prompt)
        datasets = _rg().factory.DATASETS
        self._cls, self._config = build_config(task, tasks, config, datasets)
        self.size: int = self._config.size
        self.seed: int | None = self._config.seed  # None: the seed ``dataset`` is given
        self._lock = threading.Lock()  # generators may share state; scorers run in threads
        self._chunks: LRUCache[int, Any] = LRUCache(8)
        self._entries: LRUCache[tuple[int, int], dict[str, Any]] = LRUCache(4096)
        base = self._chunk(self.seed or 0)  # a config the dataset itself refuses fails here
        members = getattr(base, "datasets", None) if task == "composite" else None
        self._scorers = (
            {name: ds.score_answer for name, ds in members.items()}
            if members is not None
            else {task: base.score_answer}
        )

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` examples (see the module docstring); env_args ``seed`` overrides ``seed``."""
        if n < 0:
            raise ValueError(f"dataset size must be >= 0, got {n}")
        base = self.seed if self.seed is not None else seed
        shots = {"shots": self._shots(base)} if self.few_shot else {}
        return [{**self._example(i, base), **shots} for i in range(n)]

    async def reset(self, example: dict[str, Any]) -> EnvState:
        """The system prompt, the example's solved shots as user/assistant turns, and its
        question (async: plain work needs no thread hop)."""
        state = super().reset(example)
        shots = example.get("shots") or []
        turns = [
            {"role": role, "content": text}
            for shot in shots
            for role, text in (
                ("user", str(shot["question"])),
                ("assistant", f"<answer>{shot['answer']}</answer>"),
            )
        ]
        state.messages[-1:-1] = turns
        return state

    async def step(self, state: EnvState, message: Message) -> EnvStep:
        return EnvStep(messages=[], done=True)

    def score(self, state: EnvState) -> dict[str, float]:
        """``correct`` (the task's score) and, with ``format_weight``, ``format``; never
        raises on model text (a bad example or a failing generator does)."""
        replies = state.assistant_messages()
        text = replies[-1] if replies and isinstance(replies[-1], str) else ""
        answer = answer_of(text)
        scores = {"correct": self._correct(answer, state.example)}
        if self.format_weight:
            scores["format"] = self.format_weight if answer is not None else 0.0
        return scores

    def _correct(self, answer: str | None, example: dict[str, Any]) -> float:
        scorer = self._scorer(example)
        entry = self._entry(example)
        if answer is not None and len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        try:
            value = float(scorer(answer, entry))
        except Exception:  # the task's scorer choked on the model's answer: not an answer
            return 0.0
        return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0

    def _scorer(self, example: dict[str, Any]) -> Any:
        task = example.get("task", self.task)
        scorer = self._scorers.get(task) if isinstance(task, str) else None
        if scorer is None:
            raise ValueError(
                f"{self.name}: example {example.get('id')!r} is of task {task!r}, which this "
                f"environment does not score (it scores {', '.join(sorted(self._scorers))})"
            )
        return scorer

    def _entry(self, example: dict[str, Any]) -> dict[str, Any]:
        """The entry the example was made from: regenerated where it still is, else the
        example's own answer and metadata."""
        where = example.get("entry")
        if isinstance(where, dict):
            seed, index = where.get("seed"), where.get("index")
            if type(seed) is int and type(index) is int and 0 <= index < self.size:
                entry = self._generate(seed, index)
                if entry.get("question") == example.get("question"):
                    return entry
        if "answer" not in example:
            raise ValueError(
                f"{self.name}: example {example.get('id')!r} has no 'answer' to score against"
            )
        metadata = example.get("metadata")
        return {
            "question": example.get("question"),
            "answer": example["answer"],
            "metadata": metadata if isinstance(metadata, dict) else {},
        }

    def _example(self, i: int, base: int) -> dict[str, Any]:
        chunk, index = divmod(i, self.size)
        seed = chunk_seed(base, chunk)
        entry = self._generate(seed, index)
        metadata = plain(entry.get("metadata") or {})
        task = metadata.get("source_dataset", self.task) if self.task == "composite" else None
        return {
            "id": i,
            "question": str(entry["question"]),
            "answer": plain(entry.get("answer")),
            "task": task or self.task,
            "metadata": metadata,
            "entry": {"seed": seed, "index": index},
        }

    def _shots(self, base: int) -> list[dict[str, Any]]:
        """``few_shot`` solved entries (with a reference answer) from a seed of their own,
        the same for every example: one prompt prefix that the engine's cache shares."""
        seed = random.Random(f"reasoning_gym/{base}/shots").getrandbits(32)
        shots: list[dict[str, Any]] = []
        for index in range(min(self.size, 10 * self.few_shot)):
            entry = self._generate(seed, index)
            if entry.get("answer") is not None:
                shots.append({"question": str(entry["question"]), "answer": plain(entry["answer"])})
            if len(shots) == self.few_shot:
                return shots
        raise ValueError(
            f"{self.name}: found {len(shots)} entries with a reference answer for "
            f"few_shot = {self.few_shot}"
        )

    def _generate(self, seed: int, index: int) -> dict[str, Any]:
        """Entry ``index`` of the dataset under ``seed`` (cached: a group's samples share it)."""
        with self._lock:
            entry = self._entries.get((seed, index))
            if entry is None:
                entry = self._chunk(seed)[index]
                self._entries.put((seed, index), entry)
            return entry

    def _chunk(self, seed: int) -> Any:
        """The task's dataset under ``seed`` (callers hold the lock, or own the env still)."""
        dataset = self._chunks.get(seed)
        if dataset is None:
            try:
                dataset = self._cls(config=dataclasses.replace(self._config, seed=seed))
            except Exception as exc:
                raise ValueError(
                    f"{self.name}: the dataset refused its config: {reason(exc)}"
                ) from exc
            self._chunks.put(seed, dataset)
        return dataset
