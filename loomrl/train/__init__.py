"""Training: the clipped policy-gradient learner, weight sync into the live engine, the loop."""

from loomrl.train.config import TrainConfig
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.loop import train
from loomrl.train.losses import policy_loss, token_weights

__all__ = ["Learner", "LearnerConfig", "TrainConfig", "policy_loss", "token_weights", "train"]
