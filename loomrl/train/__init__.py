"""Training: the clipped policy-gradient learner, its losses, critic, checkpoints and
config (the loop that drives them is ``loomrl.run.train``)."""

from loomrl.train.config import TrainConfig
from loomrl.train.learner import Learner, LearnerConfig
from loomrl.train.losses import policy_loss, token_weights

__all__ = ["Learner", "LearnerConfig", "TrainConfig", "policy_loss", "token_weights"]
