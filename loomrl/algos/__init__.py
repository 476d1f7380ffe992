"""Pure, vectorised RL maths: advantage estimators (registered by name), KL estimators,
reward and advantage shaping. Callers reach estimators only through
``loomrl.algos.advantages.compute(name, **inputs)``.
"""

from loomrl.algos import advantages, kl, pass_at_k, returns, shaping, stats

__all__ = ["advantages", "kl", "pass_at_k", "returns", "shaping", "stats"]
