"""Algorithm presets: ``algorithm = NAME`` in a ``TrainConfig`` fills the estimator, loss,
aggregation, clip ranges and KL as the algorithm's paper sets them; a field given
explicitly (TOML or flag) wins. The resolved values are what the run records.

Where a preset departs from its paper because a part is not in loomrl yet, its note says
so (``docs/training.md`` shows the table).
"""

from __future__ import annotations

from typing import Any, Literal

Algorithm = Literal[
    "grpo", "dr_grpo", "dapo", "gspo", "cpgd", "cispo", "rloo", "reinforce_pp", "ppo_no_critic",
    "ppo"
]  # fmt: skip

# name -> (fields it sets, where the values come from / what is missing)
PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "grpo": (
        {"estimator": "grpo", "estimator_options": {}, "loss": "pg",
         "aggregation": "seq-mean-token-mean", "clip_low": 0.2, "clip_high": 0.2,
         "kl_coef": 0.04},
        "DeepSeekMath (Shao et al. 2024): group-normalised advantage, per-sample token mean, "
        "ε = 0.2, k3 KL to the initial model with β = 0.04",
    ),
    "dr_grpo": (
        {"estimator": "grpo", "estimator_options": {"scale": "none"}, "loss": "pg",
         "aggregation": "constant", "clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.0},
        "Dr. GRPO (Liu et al. 2025): no std division, token sums over a constant (the "
        "generation budget: max_tokens × max_turns unless constant_normaliser is set), no KL",
    ),
    "dapo": (
        {"estimator": "grpo", "estimator_options": {}, "loss": "pg",
         "aggregation": "token-mean", "clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0,
         "dynamic_sampling": True},
        "DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28), token-level mean, no KL, dynamic "
        "sampling (groups whose rewards all agree dropped and replaced), soft overlong "
        "penalty over the last fifth of the generation budget (the paper: 4096 of 20480 "
        "tokens), factor 1",
    ),
    "gspo": (
        {"estimator": "grpo", "estimator_options": {}, "loss": "gspo",
         "aggregation": "seq-mean-token-mean", "clip_low": 3e-4, "clip_high": 4e-4,
         "kl_coef": 0.0},
        "GSPO (Zheng et al. 2025): sequence-level ratio, ε = 3e-4 / 4e-4, no KL",
    ),
    "cpgd": (
        {"estimator": "grpo", "estimator_options": {}, "loss": "cpgd",
         "aggregation": "token-mean", "clip_low": 0.2, "clip_high": 0.2, "drift_coef": 0.1,
         "kl_coef": 0.0},
        "CPGD (Liu et al. 2025): clipped log-ratio (ε = 0.2, token mean, as LightRFT), "
        "policy drift α = 0.1 (loomrl's default), no KL to the initial model",
    ),
    "cispo": (
        {"estimator": "grpo", "estimator_options": {}, "loss": "cispo",
         "aggregation": "token-mean", "clip_low": 1.0, "clip_high": 0.28, "kl_coef": 0.0},
        "CISPO (MiniMax-M1, 2025): IS weight clipped above only (ε_high = 0.28 is loomrl's "
        "default; the paper tunes it), token mean, no KL",
    ),
    "rloo": (
        {"estimator": "rloo", "estimator_options": {}, "loss": "pg",
         "aggregation": "seq-mean-token-sum", "clip_low": 0.2, "clip_high": 0.2,
         "kl_coef": 0.05, "kl_in": "reward", "kl_estimator": "k1"},
        "RLOO (Ahmadian et al. 2024): leave-one-out baseline, REINFORCE on the sequence "
        "(token sums, mean over samples), KL in the reward as the paper's "
        "r - β log(π/π_ref) (k1 summed over the sample); β = 0.05 is loomrl's default",
    ),
    "reinforce_pp": (
        {"estimator": "reinforce_pp", "estimator_options": {}, "loss": "pg",
         "aggregation": "token-mean", "clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.01,
         "kl_in": "reward", "kl_estimator": "k1"},
        "REINFORCE++ (Hu 2025): globally whitened returns, PPO clip 0.2, token mean, "
        "per-token k1 KL penalty in the reward with β = 0.01 (OpenRLHF's examples)",
    ),
    "ppo_no_critic": (
        {"estimator": "grpo", "estimator_options": {}, "loss": "pg",
         "aggregation": "token-mean", "clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.0,
         "ppo_epochs": 2},
        "PPO's update (Schulman et al. 2017: several epochs, clip 0.2) on group-normalised "
        "advantages instead of a critic; 2 epochs is loomrl's choice (the paper: 3-10)",
    ),
    "ppo": (
        {"estimator": "gae", "estimator_options": {"gamma": 1.0, "lam": 0.95}, "loss": "pg",
         "aggregation": "token-mean", "clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.0,
         "critic": True, "ppo_epochs": 2, "whiten_advantages": True},
        "PPO with a critic (Schulman et al. 2017; GAE, Schulman et al. 2016): clip 0.2, "
        "GAE with λ = 0.95 (the PPO paper's) and γ = 1.0 (verl's; a token-level episode has "
        "no discount), value clip 0.5 (verl's cliprange_value), token mean; 2 epochs is "
        "loomrl's choice (the paper: 3-10); no KL (verl's use_kl_in_reward default); "
        "advantages whitened over the batch (verl's GAE, OpenAI baselines)",
    ),
}  # fmt: skip


def apply_preset(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``data`` (raw config values) with its ``algorithm``'s values for every field it does
    not set (``defaults``: the fields' defaults). ``estimator_options`` only come with the
    preset's ``estimator`` (options of another estimator would not fit). An unknown name
    is left to the field's validation."""
    name = data.get("algorithm")
    if name not in PRESETS:
        return data
    values, _ = PRESETS[name]
    out = dict(data)
    for key, value in values.items():
        if key == "estimator_options" and "estimator" in data:
            continue
        out.setdefault(key, value)
    if name == "dr_grpo" and "constant_normaliser" not in data:
        tokens = data.get("max_tokens", defaults["max_tokens"])
        turns = data.get("max_turns") or 1
        if type(tokens) is int and type(turns) is int and tokens > 0 and turns > 0:
            out["constant_normaliser"] = float(tokens * turns)  # else: the field says why
    if name == "dapo" and "overlong_buffer" not in data:
        tokens = data.get("max_tokens", defaults["max_tokens"])
        turns = data.get("max_turns") or 1
        limit = data.get("overlong_max_tokens") or (
            tokens * turns if type(tokens) is int and type(turns) is int else None
        )
        if type(limit) is int and limit > 0:
            out["overlong_buffer"] = limit // 5  # else: the fields say why
    return out
