"""``shapes``: count and name the colours of simple shapes in a drawn 64x64 image.

Needs a vision model. An example is a JSON *recipe* (seed, shape list, question, answer),
never an image: datasets stay plain data, and ``draw`` renders a recipe with Pillow
whenever an image is needed (``reset``, a follow-up, a checkpoint being loaded). Answers
are right by construction: they are computed from the very shape list that is drawn, and
shapes sit in distinct cells of a 3x3 grid, so they never overlap.

Messages use the transformers multimodal format: a user message's content is
``[{"type": "image", "image": PIL.Image}, {"type": "text", "text": question}]``. With
``max_turns > 1`` a wrong answer gets a fresh drawing with a question of the same kind
(deterministic in the example and the turn); a right answer ends the episode. Reward
components: ``correct`` (1 or 0, the last reply against the question it answered) and
``format`` (``format_weight`` when that reply has an ``Answer: X`` line).
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import TYPE_CHECKING, Any

from loomrl.answers.parse import answer_line, extract_answer, unwrap
from loomrl.envs.base import (
    Environment,
    EnvState,
    EnvStep,
    Message,
    make_dataset,
    plain_state,
    state_from_plain,
)

if TYPE_CHECKING:
    from PIL.Image import Image

SIZE = 64  # the tiny VLM's image processor works at 64 px
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 150, 40), "blue": (30, 70, 220), "yellow": (235, 190, 0),
}  # fmt: skip
SHAPES = ("circle", "square", "triangle")
KINDS = ("count", "count_colour", "colour_of")
_CELL = SIZE // 3  # 21 px; jitter plus radius stays within 9 px of the cell centre: no overlap
_COLOUR_WORD = re.compile(r"\b(red|green|blue|yellow)\b", re.IGNORECASE)
_FOLLOW_UP = "Not quite. Try this one: "


def make_recipe(seed: int, max_shapes: int = 5, kind: str | None = None) -> dict[str, Any]:
    """One drawing and its question, deterministic in ``seed`` (``kind`` drawn unless given)."""
    rng = random.Random(seed)
    kind = kind or rng.choice(KINDS)
    target = rng.choice(SHAPES)  # colour_of: the one shape of this kind in the image
    others = [s for s in SHAPES if s != target] if kind == "colour_of" else list(SHAPES)
    shapes = []
    for i, cell in enumerate(rng.sample(range(9), rng.randint(1, max_shapes))):
        r = rng.randint(6, 8)  # smaller circles read as octagons at 64 px
        x, y = (cell % 3) * _CELL + 10, (cell // 3) * _CELL + 10
        shape = target if kind == "colour_of" and i == 0 else rng.choice(others)
        shapes.append({
            "shape": shape, "colour": rng.choice(list(COLOURS)), "r": r,
            "x": x + rng.randint(r - 9, 9 - r), "y": y + rng.randint(r - 9, 9 - r),
        })  # fmt: skip
    if kind == "count":
        question, answer = "How many shapes are there?", len(shapes)
    elif kind == "count_colour":
        colour = rng.choice(list(COLOURS))
        question = f"How many {colour} shapes are there?"
        answer = sum(s["colour"] == colour for s in shapes)
    elif kind == "colour_of":
        question, answer = f"What colour is the {target}?", shapes[0]["colour"]
    else:
        raise ValueError(f"unknown question kind {kind!r}; kinds: {', '.join(KINDS)}")
    return {"seed": seed, "kind": kind, "shapes": shapes, "question": question, "answer": answer}


def draw(recipe: dict[str, Any]) -> Image:
    """The recipe's shapes on a white 64x64 RGB image (pure: same recipe, same pixels)."""
    from PIL import Image, ImageDraw  # imported here: only vision runs need Pillow

    image = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(image)
    for s in recipe["shapes"]:
        x, y, r, fill = s["x"], s["y"], s["r"], COLOURS[s["colour"]]
        if s["shape"] == "circle":
            pen.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif s["shape"] == "square":
            pen.rectangle((x - r, y - r, x + r, y + r), fill=fill)
        else:
            pen.polygon([(x, y - r), (x + r, y + r), (x - r, y + r)], fill=fill)
    return image


def read_answer(text: str, kind: str) -> tuple[int | str | None, bool]:
    """The reply's answer and whether an ``Answer:`` line gave it: an integer for counting
    questions, a colour word for ``colour_of`` (else the last number / colour word)."""
    if kind != "colour_of":
        found = extract_answer(text)
        whole = found.value is not None and found.value.denominator == 1
        return (int(found.value) if whole else None), found.formatted  # type: ignore[arg-type]
    line = answer_line(text)
    if line is not None and unwrap(line).casefold() in COLOURS:
        return unwrap(line).casefold(), True
    last = deque(_COLOUR_WORD.finditer(text), maxlen=1)  # linear; keeps the last match
    return (last[0].group(1).casefold() if last else None), False


def _user(recipe: dict[str, Any], prefix: str = "") -> Message:
    """A user message showing the recipe's drawing and asking its question."""
    return {
        "role": "user",
        "content": [
            {"type": "image", "image": draw(recipe)},
            {"type": "text", "text": prefix + recipe["question"]},
        ],
    }


class ShapesEnv(Environment):
    """Visual counting/colour questions with an exact, verifiable answer."""

    name = "shapes"
    nonblocking = True  # drawing 64 px takes well under a millisecond; nothing blocks
    system_prompt = (
        "Look at the image and answer the question. End your reply with a line of the "
        "form 'Answer: <number>' or 'Answer: <colour>'."
    )

    def __init__(self, max_turns: int = 1, max_shapes: int = 5, format_weight: float = 0.1) -> None:
        if max_turns < 1 or not 1 <= max_shapes <= 9:
            raise ValueError(
                f"shapes needs max_turns >= 1 and 1 <= max_shapes <= 9, "
                f"got max_turns={max_turns}, max_shapes={max_shapes}"
            )
        self.max_turns, self.max_shapes, self.format_weight = max_turns, max_shapes, format_weight

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return make_dataset(n, seed, lambda rng: make_recipe(rng.getrandbits(32), self.max_shapes))

    def recipe_for(self, example: dict[str, Any], turn: int) -> dict[str, Any]:
        """The question shown before reply ``turn`` (0-based): the example itself, then a
        fresh drawing of the same kind, seeded by the example's seed and the turn."""
        if turn == 0:
            return example
        return make_recipe(
            random.Random(f"{example['seed']}/{turn}").getrandbits(32),
            self.max_shapes,
            example["kind"],
        )

    def reset(self, example: dict[str, Any]) -> EnvState:
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}]
        messages.append(_user(example))
        return EnvState(messages, example, data={"shown": [0]})

    def step(self, state: EnvState, message: Message) -> EnvStep:
        target = self.recipe_for(state.example, state.turn - 1)
        value, _ = read_answer(message["content"], target["kind"])
        correct = value == target["answer"]
        if correct or state.turn >= self.max_turns:
            return EnvStep([], done=True, info={"correct": correct})
        state.data.setdefault("shown", [0]).append(state.turn)
        follow = self.recipe_for(state.example, state.turn)
        return EnvStep([_user(follow, _FOLLOW_UP)], done=False, info={"correct": False})

    def score(self, state: EnvState) -> dict[str, float]:
        replies = state.assistant_messages()
        if not replies:
            return {"correct": 0.0, "format": 0.0}
        target = self.recipe_for(state.example, len(replies) - 1)
        value, formatted = read_answer(replies[-1], target["kind"])
        return {
            "correct": float(value == target["answer"]),
            "format": self.format_weight if formatted else 0.0,
        }

    def state_dict(self, state: EnvState) -> dict[str, Any]:
        """Plain data: each image part becomes ``{"type": "image", "turn": t}``, the turn
        whose recipe drew it (``state.data["shown"]``, in order), redrawn on load."""
        turns = iter(state.data.get("shown", []))
        messages = []
        for m in state.messages:
            if isinstance(m.get("content"), list):
                parts = [
                    {"type": "image", "turn": next(turns, None)} if p.get("type") == "image" else p
                    for p in m["content"]
                ]
                if any(p.get("turn", 0) is None for p in parts):
                    raise TypeError("state.messages show more images than state.data['shown']")
                m = {**m, "content": parts}
            messages.append(m)
        copy = EnvState(messages, state.example, state.tools, state.turn, state.data)
        return plain_state(copy)

    def load_state_dict(self, data: dict[str, Any]) -> EnvState:
        state = state_from_plain(data)
        state.messages = [  # new dicts: ``data`` stays as it was (it may be loaded again)
            {**m, "content": [self._redraw(state.example, p) for p in m["content"]]}
            if isinstance(m.get("content"), list) else m
            for m in state.messages
        ]  # fmt: skip
        return state

    def _redraw(self, example: dict[str, Any], part: Any) -> Any:
        """A stored image part drawn again (other parts as they are)."""
        if not isinstance(part, dict) or part.get("type") != "image":
            return part
        turn = part.get("turn")
        if type(turn) is not int or turn < 0:
            raise ValueError(f"a stored image part names no turn: {part!r}")
        try:
            return {"type": "image", "image": draw(self.recipe_for(example, turn))}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"cannot redraw the image of turn {turn}: {exc!r}") from None
