"""Bridges from loomrl to other training frameworks; each module's framework is an extra.

``loomrl.integrations.trl``: ``rollout_func`` for TRL's ``GRPOTrainer`` (``loomrl[trl]``).
Importing a module here never imports its framework.
"""
