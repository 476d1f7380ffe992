"""The family matrix on real vLLM: for each model family, a tiny random model built from
the family's own config class (``family_models``), with a tokenizer that carries the
family's chat template and markers (``families``), rolls out a 3-turn calculator episode
(two tool calls, then the answer) and is checked token by token (``tests/contract.py``).

Random weights never write a tool call, so each turn's ids (the family's own rendering
of the call) are forced by a logits processor (``family_force``); vLLM does everything
else: the prompt as sent, the forward passes, the stop on the family's end marker and the
logprobs (raw: the model's own, before the mask), which must equal the learner's
recompute of the same trajectory with the same weights. Families that share an
architecture and a vocabulary share one engine, started once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from families import EXAMPLE, FAMILIES, calculator, check_episode, family_tokenizer, replies
from family_models import build

import loomrl
from loomrl.engines.vllm import VLLMEngine
from loomrl.experience import compute_logprobs, pad
from loomrl.models.loading import load_lm
from loomrl.tokens import ChatTokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::loomrl.tokens.TemplateWarning")]

# The architecture each family is built as; families listed together share an engine.
ARCHS = {
    "qwen3": ["hermes", "qwen3_coder", "qwen3_5"],  # first: the thinking test shares it
    "llama": ["llama3_1", "llama3_2"],
    "mistral": ["mistral", "mistral_args"],
    "gpt_oss": ["gpt_oss"],
    "glm4_moe": ["glm45"],
    "deepseek_v3": ["deepseek_v3"],
}
CASES = [(arch, name) for arch, names in ARCHS.items() for name in names]
# vLLM's logprobs against the learner's, fp32 on both sides. DeepSeek's latent attention
# (MLA) is 4e-3 apart on vLLM's CPU MLA kernel (measured), every other family 2e-6.
LOGPROB_ATOL = {"deepseek_v3": 1e-2}


class Engines:
    """One engine at a time: the cases come grouped by architecture."""

    def __init__(self, base_tokenizer: Any, root: Path) -> None:
        self.base, self.root = base_tokenizer, root
        self.arch: str | None = None
        self.engine: VLLMEngine | None = None

    async def get(self, arch: str) -> VLLMEngine:
        if arch != self.arch:
            await self.close()
            tok = family_tokenizer(self.base, FAMILIES[ARCHS[arch][0]])
            model_dir = build(arch, tok, self.root / arch)
            self.engine = VLLMEngine(
                str(model_dir), max_model_len=1024, max_num_seqs=4, dtype="float32",
                logprobs_mode="raw_logprobs", logits_processors=["family_force:ForceScript"],
            )  # fmt: skip
            self.arch = arch
        assert self.engine is not None
        return self.engine

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
        self.engine, self.arch = None, None


@pytest.fixture(scope="module")
async def engines(tokenizer, tmp_path_factory):
    made = Engines(tokenizer, tmp_path_factory.mktemp("families"))
    yield made
    await made.close()


def forced(engine: VLLMEngine, scripts: list[list[int]], prompts: list[list[int]]) -> Any:
    """``engine`` whose n-th request samples ``scripts[n]`` (its prompt kept in ``prompts``)."""
    from family_force import SCRIPT  # imports vLLM: not at the unit run's collection

    generate, vllm_params = engine.generate, engine._vllm_params

    async def scripted_generate(prompt_ids, params, request_id=None, **kwargs):
        prompts.append(list(prompt_ids))
        return await generate(prompt_ids, params, request_id, **kwargs)

    def scripted_params(params, prompt_len):
        sampling = vllm_params(params, prompt_len)
        sampling.extra_args = {SCRIPT: scripts[len(prompts) - 1]}
        return sampling

    return scripted_generate, scripted_params


def learner_logprobs(model_dir: Path, traj: Any) -> torch.Tensor:
    model = load_lm(model_dir, torch.float32)
    batch = pad([traj])
    return batch.per_sample(compute_logprobs(model, batch))[0]


async def test_a_thinking_model_keeps_the_reasoning_its_template_drops_on_vllm(
    engines, tokenizer, monkeypatch
):
    """docs/thinking.md on real vLLM: Qwen3 reasons before every turn and its template
    drops earlier turns' reasoning after a new user query; the trajectory keeps what the
    model saw and sampled (the third turn's prompt holds both earlier blocks), and vLLM's
    logprobs of it are the learner's."""
    from contract import check_turns
    from thinking_turns import FOLLOW_UP_TURNS, FollowUp, reasoning_is_the_models

    tok = family_tokenizer(tokenizer, FAMILIES["hermes"])
    engine = await engines.get("qwen3")
    chat = ChatTokenizer(tok)
    scripts = [chat.encode(text) for text in FOLLOW_UP_TURNS]
    prompts: list[list[int]] = []
    generate, params = forced(engine, scripts, prompts)
    monkeypatch.setattr(engine, "generate", generate)
    monkeypatch.setattr(engine, "_vllm_params", params)
    sampling = loomrl.SamplingParams(max_tokens=200)
    (traj,) = await loomrl.rollout(engine, FollowUp(), [EXAMPLE], chat=chat, sampling=sampling)

    assert traj.turns == 3 and traj.reward == 1.0, traj.error
    assert [traj.completion_ids[a:b] for a, b in traj.spans] == scripts
    reasoning_is_the_models(tok, traj, blocks=3)
    check_turns(tok, traj, {tok.eos_token_id})
    assert prompts[2].count(tok.convert_tokens_to_ids("<think>")) == 2
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
    expected = learner_logprobs(engines.root / "qwen3", traj)[mask]
    assert (torch.tensor(traj.logprobs)[mask] - expected).abs().max() <= 1e-4


@pytest.mark.parametrize(("arch", "name"), CASES)
async def test_a_three_turn_tool_episode_on_vllm_is_token_exact(
    engines, tokenizer, monkeypatch, arch, name
):
    family = FAMILIES[name]
    tok = family_tokenizer(tokenizer, family)
    engine = await engines.get(arch)
    chat = family.chat(tok)
    scripts = [chat.encode(text) for text in replies(tok, family)]
    prompts: list[list[int]] = []
    generate, params = forced(engine, scripts, prompts)
    monkeypatch.setattr(engine, "generate", generate)
    monkeypatch.setattr(engine, "_vllm_params", params)
    stops = tuple(tok.convert_tokens_to_ids(list(family.stops)))
    sampling = loomrl.SamplingParams(max_tokens=200, stop_token_ids=stops)
    (traj,) = await loomrl.rollout(
        engine, calculator(family), [EXAMPLE], chat=chat, sampling=sampling
    )

    check_episode(tok, family, chat, traj, prompts, name)
    sampled = [
        traj.completion_ids[start:end] for start, end in traj.spans
    ]  # what vLLM sampled, turn by turn: the forced ids, ended by vLLM on the stop
    assert sampled == scripts
    expected = learner_logprobs(engines.root / arch, traj)
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
    got = torch.tensor(traj.logprobs)[mask]
    assert got.lt(-1.0).all()  # the model's own logprobs, not the mask's (0)
    apart = (got - expected[mask]).abs().max().item()
    print(f"{name} ({arch}): vLLM vs learner logprobs max abs diff {apart:.1e}")
    assert apart <= LOGPROB_ATOL.get(arch, 1e-4)
