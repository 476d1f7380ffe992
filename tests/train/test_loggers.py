"""Metric sinks: rows reach TensorBoard / W&B (fake modules stand in for the optional
packages, the one boundary faked here); a named backend that is missing fails at start."""

from __future__ import annotations

import sys
import types

import pytest

from loomrl.train.loggers import open_sinks

ROW = {"step": 3, "reward_mean": 0.5, "grad_norm": 1.25, "learner_s": None, "flag": True}


def test_unknown_backend_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown log_to backend\(s\) \['mlflow'\]"):
        open_sinks(["mlflow"], tmp_path, {})


def test_named_backend_that_is_not_installed_fails_with_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'loomrl\[wandb\]'"):
        open_sinks(["wandb"], tmp_path, {})


def test_rows_reach_wandb_with_their_step(tmp_path, monkeypatch):
    logged, inits = [], []

    class Run:
        def log(self, values, step):
            logged.append((step, values))

    fake = types.SimpleNamespace(init=lambda **kw: inits.append(kw) or Run())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (sink,) = open_sinks(["wandb"], tmp_path, {"lr": 1e-5})
    sink(ROW)
    assert inits[0]["config"] == {"lr": 1e-5} and inits[0]["dir"] == str(tmp_path)
    assert logged == [(3, {"reward_mean": 0.5, "grad_norm": 1.25})]  # numbers only


def test_rows_reach_tensorboard_as_scalars(tmp_path, monkeypatch):
    scalars = []

    class Writer:
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_text(self, tag, text):
            pass

        def add_scalar(self, key, value, global_step):
            scalars.append((key, value, global_step))

        def flush(self):
            pass

    monkeypatch.setitem(sys.modules, "tensorboard", types.ModuleType("tensorboard"))
    board = types.ModuleType("torch.utils.tensorboard")
    board.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", board)
    (sink,) = open_sinks(["tensorboard"], tmp_path, {})
    sink(ROW)
    assert sorted(scalars) == [("grad_norm", 1.25, 3), ("reward_mean", 0.5, 3)]
