"""The training run the command-line tests share."""

# A two-step training run small enough to write once per module.
TINY_TRAIN = """[train]
model = "tiny-random"
env = "arith"
steps = 2
prompts_per_step = 1
n = 2
max_tokens = 4
max_len = 128
checkpoint_every = 1
lr = 0.001

[train.env_args]
max_operand = 5
"""
