"""The policy losses under their historical import path; see ``loomrl.train.losses``."""

from loomrl.train.losses import (
    AGGREGATIONS,
    Aggregation,
    LossParts,
    policy_loss,
    token_weights,
)

__all__ = ["AGGREGATIONS", "Aggregation", "LossParts", "policy_loss", "token_weights"]
