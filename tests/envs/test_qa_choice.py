"""qa's multiple choice: which letter a reply chose, the reference's option, the options."""

from __future__ import annotations

import pytest

from loomrl.answers.choice import check_choices, chosen, reference_index
from loomrl.envs.qa.prompts import render


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        # 1. the last box
        (r"so \boxed{B}", "B"),
        (r"$\boxed{\text{(C)}}$", "C"),
        (r"\boxed{d}", "D"),
        (r"first \boxed{A} then \boxed{C}", "C"),
        # 2. the last Answer: line
        ("Work.\nAnswer: B", "B"),
        ("Answer: (B) Paris", "B"),
        ("Answer: **C**", "C"),
        ("  answer: b.", "B"),
        ("Answer: A\nAnswer: D", "D"),
        # 3. the last phrase anywhere
        ("The answer is (B).", "B"),
        ("The correct option is: **D**", "D"),
        ("I pick option C because ...", "C"),
        ("**Answer: B**", "B"),
        ("The answer is A. No wait, the answer is C.", "C"),
        ("the answer would be B", "B"),
        # 4. the reply's first characters
        ("B.", "B"),
        ("**B**", "B"),
        ("(C) Paris is the capital", "C"),
        ("D\nbecause ...", "D"),
        ("A: the first one", "A"),
        # no choice
        ("A cat sat on the mat", None),  # a word, not a choice
        ("Answer: a cat", None),  # lower case counts only alone
        ("I think C", None),
        ("Paris", None),
        ("", None),
        (r"\boxed{}", None),
        ("The answers are many", None),
    ],
)
def test_chosen_letter(reply, expected):
    index = chosen(reply, 4)
    assert (None if index is None else "ABCD"[index]) == expected


def test_letters_out_of_range_are_no_choice():
    assert chosen(r"\boxed{E}", 4) is None
    assert chosen(r"\boxed{E}", 5) == 4
    # An out-of-range phrase does not hide an earlier one in range.
    assert chosen("The answer is B. Option X is silly.", 4) == 1
    assert chosen("Z.", 26) == 25 and chosen("Z.", 4) is None


def test_a_box_beats_an_answer_line_beats_phrases():
    assert chosen("The answer is A.\nAnswer: B\n" + r"\boxed{C}", 4) == 2
    assert chosen("The answer is A.\nAnswer: B", 4) == 1
    # A box without a letter falls through to the next rule.
    assert chosen(r"\boxed{42} so the answer is D", 4) == 3


@pytest.mark.parametrize(
    ("answer", "choices", "index"),
    [
        ("B", None, 1),
        ("b", None, 1),
        (" (C) ", None, 2),
        ("D.", ["w", "x", "y", "z"], 3),
        (0, ["w", "x"], 0),
        (25, None, 25),
        ("Paris", ["Lyon", "Paris"], 1),  # an option's exact text
    ],
)
def test_reference_index(answer, choices, index):
    assert reference_index(answer, choices) == index


@pytest.mark.parametrize(
    ("answer", "choices", "message"),
    [
        ("E", ["a", "b", "c", "d"], "out of range for 4 options"),
        (4, ["a", "b", "c", "d"], "out of range for 4 options"),
        (-1, None, "out of range for 26 options"),
        ("Rome", ["Lyon", "Paris"], "a letter or an index, got 'Rome'"),
        ("AB", None, "a letter or an index"),
        (True, None, "a letter or an index, got True"),
        (1.0, None, "a letter or an index"),
        (["A"], None, "a letter or an index"),
    ],
)
def test_bad_references_say_why(answer, choices, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        reference_index(answer, choices)


def test_options_are_rendered_under_the_question():
    assert render("Capital of France? ", ["Lyon", "Paris", 3]) == (
        "Capital of France?\n\nA. Lyon\nB. Paris\nC. 3"
    )
    assert check_choices(["x", 2, 2.5]) == ["x", "2", "2.5"]
    for bad in ("AB", ["only one"], [str(i) for i in range(27)], ["a", None], ["a", True]):
        with pytest.raises(ValueError, match="'choices' must"):
            check_choices(bad)
