"""RewardModel on a tiny random LlamaForSequenceClassification saved to disk."""

from __future__ import annotations

import pytest
import torch

from loomrl.rewards import Recipe, RewardModel, RewardSample, RewardSource

COMPLETIONS = [
    "4",
    "The answer is four, because two plus two makes four.",
    "I think it is 5.",
    "Let me count: one, two, three, four. So the answer is 4, and I am sure of it.",
    "four",
    "2 + 2 = 4",
    "No idea, sorry!",
]


def samples(label: str = "default") -> list[RewardSample]:
    return [RewardSample(prompt="What is 2 + 2?", completion=c, label=label) for c in COMPLETIONS]


@pytest.fixture(scope="module")
def rm(classifier_dir) -> RewardModel:
    return RewardModel(classifier_dir, batch_size=3, device="cpu")


@pytest.fixture(scope="module")
def raw(classifier_dir) -> RewardModel:
    return RewardModel(classifier_dir, input="completion")


async def test_batched_scores_equal_one_by_one_scores(rm, classifier_dir):
    batched = await rm(samples())
    single = RewardModel(classifier_dir, batch_size=1)
    one_by_one = [(await single([s]))[0] for s in samples()]
    assert len(batched) == len(COMPLETIONS) and all(isinstance(x, float) for x in batched)
    assert torch.allclose(torch.tensor(batched), torch.tensor(one_by_one), atol=1e-5, rtol=0)
    assert len(set(batched)) == len(batched)  # the inputs really are told apart
    assert isinstance(rm, RewardSource)


async def test_a_left_padding_tokenizer_gives_the_same_scores(rm, make_classifier):
    left = RewardModel(make_classifier(0, padding_side="left"), batch_size=4)
    assert left.tokenizer.padding_side == "left"  # the tokenizer is left as it was saved
    ours, theirs = await rm(samples()), await left(samples())
    # A second build from seed 0 (with a left-padding tokenizer) scores like the first.
    assert torch.allclose(torch.tensor(ours), torch.tensor(theirs), atol=1e-5, rtol=0)


async def test_scores_are_deterministic_and_depend_on_the_seed(rm, make_classifier):
    ours = await rm(samples())
    assert await rm(samples()) == ours
    other = RewardModel(make_classifier(1), batch_size=7)
    assert not torch.allclose(torch.tensor(await other(samples())), torch.tensor(ours), atol=1e-3)


async def test_chat_input_renders_the_conversation_and_other_inputs_differ(rm, raw, classifier_dir):
    sample = RewardSample(prompt="What is 2 + 2?", completion="4")
    text = rm.render(sample)
    assert text.endswith(
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    )
    assert raw.render(sample) == "4"
    custom = RewardModel(classifier_dir, input=lambda s: f"Q: {s.prompt} A: {s.completion}")
    assert custom.render(sample) == "Q: What is 2 + 2? A: 4"
    scores = [(await m([sample]))[0] for m in (rm, raw, custom)]
    assert len(set(scores)) == 3


async def test_recipe_sends_one_batch_to_the_reward_model(rm):
    calls = []
    real = rm.score_texts

    def spy(texts, **kwargs):
        calls.append(len(texts))
        return real(texts, **kwargs)

    rm.score_texts = spy
    try:
        recipe = Recipe({"chat": [("rm", 1.0)], "math": [("num_chars", 0.0)]}, sources={"rm": rm})
        results = await recipe.score_many(samples("chat")[:5] + samples("math")[:2])
    finally:
        del rm.score_texts
    assert calls == [5]
    assert [set(r.values) for r in results] == [{"rm"}] * 5 + [{"num_chars"}] * 2


async def test_max_length_cuts_from_the_left_and_long_inputs_fail_without_it(raw, classifier_dir):
    long = RewardSample(prompt="q", completion="word" + " word" * 199)  # 200 tokens
    with pytest.raises(
        ValueError,
        match=r"reward model input 0 has 200 tokens, more than the "
        r"model's 96 positions: pass max_length=",
    ):
        await raw([long])
    cut = RewardModel(classifier_dir, input="completion", max_length=16)
    assert cut.tokenizer.truncation_side == "left"
    (score,) = await cut([long])
    (tail,) = await cut([RewardSample(prompt="q", completion=" word" * 16)])
    assert score == pytest.approx(tail, abs=1e-5)  # the same last 16 tokens


async def test_an_input_ending_in_the_pad_token_is_refused(raw):
    with pytest.raises(
        ValueError,
        match=r"reward model input 1 ends with the pad token "
        r"'<\|im_end\|>' \(id 2\)",
    ):
        await raw([RewardSample("q", "fine"), RewardSample("q", "sneaky<|im_end|>")])
    assert await raw([]) == []


def test_construction_errors_are_precise(tmp_path, make_classifier):
    with pytest.raises(ValueError, match=r"is not a local directory \(models are never downloaded"):
        RewardModel(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        RewardModel(tmp_path, batch_size=0)
    with pytest.raises(ValueError, match="input must be 'chat', 'completion' or a callable"):
        RewardModel(tmp_path, input="text")
    two = make_classifier(2, num_labels=2)
    with pytest.raises(ValueError, match="has 2 labels; pass label_index="):
        RewardModel(two)
    with pytest.raises(ValueError, match="label_index 2 is out of range for 2 labels"):
        RewardModel(two, label_index=2)
    assert RewardModel(two, label_index=1).label_index == 1


async def test_a_model_without_pad_token_or_chat_template(make_classifier):
    bare = make_classifier(3, bare=True)
    with pytest.raises(ValueError, match="has no chat template; pass input='completion'"):
        RewardModel(bare)
    with pytest.raises(
        ValueError,
        match=r"defines no pad token .* set pad_token_id in its "
        r"config or pass batch_size=1",
    ):
        RewardModel(bare, input="completion")
    single = RewardModel(bare, input="completion", batch_size=1)
    assert len(await single(samples()[:2])) == 2
