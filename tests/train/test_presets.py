"""Algorithm presets: each resolves to the values docs/training.md documents, an explicit
field wins, an unknown name is one error line naming the known ones. (A run of each
preset, from its example file: ``test_examples.py``.)"""

from __future__ import annotations

import json
import tomllib
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from loomrl.cli.output import one_line
from loomrl.train.config import TrainConfig
from loomrl.train.presets import PRESETS, Algorithm

DOC = Path(__file__).parents[2] / "docs" / "training.md"
COLUMNS = ("estimator", "estimator_options", "loss", "aggregation", "clip_low", "clip_high",
           "kl_coef")  # fmt: skip


def documented() -> dict[str, dict[str, typing.Any]]:
    """The presets table of docs/training.md: algorithm -> field values (``also`` parsed
    from ``field = value`` pairs)."""
    lines = DOC.read_text().split("### Presets", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [line for line in lines if line.startswith("| `")]
    table = {}
    for line in rows:
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        name, values, also = cells[0], cells[1:8], cells[8]
        row = {
            k: json.loads(v) if k == "estimator_options" else v
            for k, v in zip(COLUMNS, values, strict=True)
        }
        for k in ("clip_low", "clip_high", "kl_coef"):
            row[k] = float(row[k])
        for pair in filter(None, (p.strip().strip("`") for p in also.split(";"))):
            key, _, value = pair.partition(" = ")
            row[key] = tomllib.loads(f"x = {value}")["x"] if "×" not in value else value
        table[name] = row
    return table


def test_the_documented_table_names_every_preset():
    assert sorted(documented()) == sorted(PRESETS) == sorted(typing.get_args(Algorithm))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_resolves_to_its_documented_values(name):
    resolved = TrainConfig(algorithm=name, max_tokens=48, max_turns=2)
    for key, value in documented()[name].items():
        if key == "constant_normaliser":  # "max_tokens × max_turns"
            assert resolved.constant_normaliser == 96.0
            continue
        if key == "overlong_buffer":  # "max_tokens × max_turns / 5", rounded down
            assert resolved.overlong_buffer == 19
            continue
        assert getattr(resolved, key) == value, key
    plain = TrainConfig()  # every field a preset leaves alone keeps its default
    untouched = set(TrainConfig.model_fields) - set(PRESETS[name][0]) - {
        "algorithm", "constant_normaliser", "overlong_buffer", "max_tokens", "max_turns",
    }  # fmt: skip
    for key in untouched:
        assert getattr(resolved, key) == getattr(plain, key), key


def test_explicit_fields_win_over_the_preset(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nalgorithm = "gspo"\nclip_high = 0.001\naggregation = "token-mean"\n')
    c = TrainConfig.load(path)
    assert (c.loss, c.clip_low, c.clip_high, c.aggregation) == ("gspo", 3e-4, 0.001, "token-mean")
    c = TrainConfig(algorithm="dr_grpo", estimator="rloo", constant_normaliser=7.0)
    assert c.estimator == "rloo" and c.estimator_options == {}  # grpo's options stay out
    assert c.constant_normaliser == 7.0 and c.aggregation == "constant"
    assert TrainConfig.load(path, {"seed": 3}).clip_high == 0.001


def test_an_unknown_algorithm_is_one_line_naming_the_known_ones(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nalgorithm = "trpo"\n')
    with pytest.raises(ValidationError) as err:
        TrainConfig.load(path)
    line = one_line(err.value)
    assert "\n" not in line and 'algorithm = "trpo"' in line
    for name in PRESETS:
        assert f"'{name}'" in line


def test_loss_fields_that_do_not_fit_are_refused():
    with pytest.raises(ValidationError, match="drift_coef is cpgd's; loss = 'pg'"):
        TrainConfig(drift_coef=0.1)
    with pytest.raises(ValidationError, match="clip_low must be < 1"):
        TrainConfig(algorithm="cpgd", clip_low=1.0)
    with pytest.raises(ValidationError, match="loss"):
        TrainConfig(loss="ppo")
