"""Stand-ins for TRL's side of ``loomrl.integrations.trl``: an env whose reward is the
question's length and a trainer with only what ``rollout_func`` reads."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from loomrl.envs.base import Environment, EnvState


class QuestionEnv(Environment):
    """Single turn; the reward is the length of the question the env was given."""

    name = "question_len"

    def score(self, state: EnvState) -> float:
        return float(len(state.example["question"]))


def fake_trainer(step: int, temperature: float = 1.0, model=None) -> SimpleNamespace:
    return SimpleNamespace(
        state=SimpleNamespace(global_step=step),
        model=torch.nn.Linear(2, 2) if model is None else model,
        args=SimpleNamespace(temperature=temperature),
    )
