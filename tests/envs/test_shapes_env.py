"""shapes: recipes as data, deterministic drawings, scoring, follow-ups, checkpoints."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from loomrl.envs import advance, load
from loomrl.envs.shapes import (
    COLOURS,
    KINDS,
    SHAPES,
    SIZE,
    ShapesEnv,
    draw,
    make_recipe,
    read_answer,
)


def expected_answer(recipe: dict) -> int | str:
    """The answer recomputed from the shape list and the question's wording."""
    shapes, question = recipe["shapes"], recipe["question"]
    if recipe["kind"] == "count":
        assert question == "How many shapes are there?"
        return len(shapes)
    if recipe["kind"] == "count_colour":
        (colour,) = [c for c in COLOURS if f"How many {c} shapes" in question]
        return sum(s["colour"] == colour for s in shapes)
    (shape,) = [s for s in SHAPES if f"What colour is the {s}?" == question]
    (only,) = [s for s in shapes if s["shape"] == shape]  # exactly one: the answer is unique
    return only["colour"]


def image_of(message: dict) -> Image.Image:
    (part,) = [p for p in message["content"] if p["type"] == "image"]
    return part["image"]


def text_of(message: dict) -> str:
    return "".join(p["text"] for p in message["content"] if p["type"] == "text")


def wrong(recipe: dict) -> str:
    """A reply that is certainly wrong (formatted)."""
    if recipe["kind"] == "colour_of":
        return "Answer: " + next(c for c in COLOURS if c != recipe["answer"])
    return f"Answer: {recipe['answer'] + 1}"


def test_dataset_is_deterministic_json_and_varied():
    env = ShapesEnv()
    data = env.dataset(60, seed=3)
    assert data == env.dataset(60, seed=3) and data != env.dataset(60, seed=4)
    assert env.dataset(5, seed=3) == data[:5]
    assert [e["id"] for e in data] == list(range(60))
    assert json.loads(json.dumps(data)) == data
    assert {e["kind"] for e in data} == set(KINDS)
    assert {s["shape"] for e in data for s in e["shapes"]} == set(SHAPES)
    assert {s["colour"] for e in data for s in e["shapes"]} == set(COLOURS)
    assert all(1 <= len(e["shapes"]) <= 5 for e in data)


def test_answers_are_right_by_construction_and_shapes_fit_apart():
    for recipe in ShapesEnv(max_shapes=9).dataset(300, seed=0):
        assert recipe["answer"] == expected_answer(recipe), recipe
        boxes = [
            (s["x"] - s["r"], s["y"] - s["r"], s["x"] + s["r"], s["y"] + s["r"])
            for s in recipe["shapes"]
        ]
        assert all(min(box) >= 0 and max(box) < SIZE for box in boxes)
        for i, p in enumerate(boxes):  # no two shapes overlap, so counts are unambiguous
            assert all(p[2] < q[0] or q[2] < p[0] or p[3] < q[1] or q[3] < p[1] for q in boxes[:i])


def test_draw_is_pure_and_differs_across_examples():
    data = ShapesEnv().dataset(20, seed=1)
    first = draw(data[0])
    assert (first.size, first.mode) == ((SIZE, SIZE), "RGB")
    assert draw(data[0]).tobytes() == first.tobytes()
    assert len({draw(e).tobytes() for e in data}) == 20
    colours = {c for _, c in first.getcolors(SIZE * SIZE)}
    drawn = {COLOURS[s["colour"]] for s in data[0]["shapes"]}
    assert (255, 255, 255) in colours and drawn <= colours


def test_make_recipe_kinds():
    assert make_recipe(5, kind="colour_of")["question"].startswith("What colour is the")
    assert make_recipe(5) == make_recipe(5)
    with pytest.raises(ValueError, match="kind"):
        make_recipe(5, kind="size")


def test_reset_shows_one_image_and_the_question():
    env = ShapesEnv()
    example = env.dataset(1, seed=2)[0]
    state = env.reset(example)
    assert [m["role"] for m in state.messages] == ["system", "user"]
    assert "Answer:" in state.messages[0]["content"]
    user = state.messages[1]
    assert [p["type"] for p in user["content"]] == ["image", "text"]
    image = image_of(user)
    assert isinstance(image, Image.Image) and image.size == (64, 64) and image.mode == "RGB"
    assert image.tobytes() == draw(example).tobytes()
    assert text_of(user) == example["question"]


def test_read_answer():
    assert read_answer("I count 3.\nAnswer: 4", "count") == (4, True)
    assert read_answer("there are 2 or maybe 3", "count") == (3, False)
    assert read_answer("Answer: 2.5", "count_colour") == (None, True)
    assert read_answer("nothing", "count") == (None, False)
    assert read_answer("It looks Blue.\nAnswer: **Red**.", "colour_of") == ("red", True)
    assert read_answer("red at first, but it is green", "colour_of") == ("green", False)
    assert read_answer("Answer: the circle is blue", "colour_of") == ("blue", False)
    assert read_answer("reddish", "colour_of") == (None, False)


@pytest.mark.parametrize("kind", KINDS)
async def test_scoring_right_wrong_and_format(kind):
    env = ShapesEnv(format_weight=0.2)
    example = {"id": 0, **make_recipe(9, kind=kind)}

    async def score(reply: str) -> dict[str, float]:
        state = env.reset(example)
        step = await advance(env, state, reply)
        assert step.done and step.messages == []  # single turn: every reply ends it
        return env.score(state)

    answer = example["answer"]
    assert await score(f"Let me look.\nAnswer: {answer}") == {"correct": 1.0, "format": 0.2}
    assert await score(f"I think it is {answer}") == {"correct": 1.0, "format": 0.0}
    assert await score(wrong(example)) == {"correct": 0.0, "format": 0.2}
    assert await score("no idea") == {"correct": 0.0, "format": 0.0}
    assert env.score(env.reset(example)) == {"correct": 0.0, "format": 0.0}


async def test_wrong_then_right_takes_two_turns_with_a_new_image():
    env = ShapesEnv(max_turns=3)
    example = env.dataset(1, seed=7)[0]
    state = env.reset(example)
    step = await advance(env, state, wrong(example))
    assert not step.done and step.info == {"correct": False}
    (follow,) = step.messages
    assert follow["role"] == "user" and text_of(follow).startswith("Not quite. Try this one:")
    second = env.recipe_for(example, 1)
    assert second["kind"] == example["kind"] and second != example
    assert text_of(follow).endswith(second["question"])
    assert image_of(follow).tobytes() == draw(second).tobytes()
    assert image_of(follow).tobytes() != image_of(state.messages[1]).tobytes()
    assert env.score(state) == {"correct": 0.0, "format": 0.1}
    step = await advance(env, state, f"Answer: {second['answer']}")
    assert step.done and step.messages == [] and state.turn == 2
    assert env.score(state) == {"correct": 1.0, "format": 0.1}
    assert state.data["shown"] == [0, 1]
    # Follow-ups are deterministic in the example and the turn.
    assert ShapesEnv(max_turns=3).recipe_for(example, 1) == second


async def test_last_allowed_turn_ends_without_another_image():
    env = ShapesEnv(max_turns=2)
    example = env.dataset(1, seed=8)[0]
    state = env.reset(example)
    await advance(env, state, wrong(example))
    step = await advance(env, state, wrong(env.recipe_for(example, 1)))
    assert step.done and step.messages == [] and step.info == {"correct": False}
    assert env.score(state)["correct"] == 0.0


def assert_same_messages(a: list[dict], b: list[dict]) -> None:
    def plain(messages):
        return [
            {**m, "content": [
                {**p, "image": p["image"].tobytes()} if p["type"] == "image" else p
                for p in m["content"]
            ]} if isinstance(m["content"], list) else m
            for m in messages
        ]  # fmt: skip

    assert plain(a) == plain(b)


async def test_state_dict_round_trip_redraws_the_images():
    env = ShapesEnv(max_turns=4)
    example = env.dataset(1, seed=5)[0]
    state = env.reset(example)
    await advance(env, state, wrong(example))
    await advance(env, state, wrong(env.recipe_for(example, 1)))
    saved = env.state_dict(state)
    assert json.loads(json.dumps(saved)) == saved  # plain JSON data, no images
    lists = [m["content"] for m in saved["messages"] if isinstance(m["content"], list)]
    images = [p for parts in lists for p in parts if p["type"] == "image"]
    assert images == [{"type": "image", "turn": t} for t in (0, 1, 2)]
    text = json.dumps(saved)
    loaded = env.load_state_dict(saved)
    assert json.dumps(saved) == text  # loading leaves the saved data as it was
    assert (loaded.example, loaded.turn, loaded.data) == (state.example, 2, {"shown": [0, 1, 2]})
    assert_same_messages(loaded.messages, state.messages)
    assert_same_messages(env.load_state_dict(json.loads(text)).messages, state.messages)
    # The loaded episode goes on as the original would.
    step = await advance(env, loaded, f"Answer: {env.recipe_for(example, 2)['answer']}")
    assert step.done and env.score(loaded)["correct"] == 1.0


def test_load_state_dict_refuses_bad_image_parts():
    env = ShapesEnv()
    saved = env.state_dict(env.reset(env.dataset(1)[0]))
    saved["messages"][1]["content"][0] = {"type": "image", "turn": "x"}
    with pytest.raises(ValueError, match="turn"):
        env.load_state_dict(saved)


def test_settings_are_checked():
    with pytest.raises(ValueError):
        ShapesEnv(max_turns=0)
    with pytest.raises(ValueError):
        ShapesEnv(max_shapes=10)
    env = ShapesEnv(max_turns=3)
    assert env.max_turns == 3 and env.nonblocking


def test_registered_by_name():
    env = load("shapes", max_turns=3)
    assert isinstance(env, ShapesEnv) and env.max_turns == 3
