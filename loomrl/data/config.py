"""``DataConfig``: where a run's examples come from, as a TOML value or table.

``data = "math.jsonl"`` is short for ``data = {path = "math.jsonl"}``. A relative path
is relative to the directory the command runs in (as ``out`` is); a path that does not
exist there and has the shape ``org/dataset[@revision]`` names a data set on the Hugging
Face Hub (``loomrl.data.hub``), unless it is written as a path (``./org/dataset``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loomrl.data.hub import as_written
from loomrl.data.load import Example, Splits, load_splits
from loomrl.data.rows import map_problem


class DataConfig(BaseModel):
    """A data file (or ``datasets`` directory) and how to read examples from it."""

    model_config = ConfigDict(extra="forbid")

    path: Path = Field(
        description="JSONL, JSON, CSV, TSV or Parquet file, a `datasets` save_to_disk "
        "directory, or a data set on the Hugging Face Hub (org/dataset[@revision], read "
        "through the Hugging Face cache)"
    )
    format: str | None = Field(
        None,
        description="jsonl, json, csv, tsv, parquet or a `datasets` builder name (arrow, "
        "text, ...); default: from the file's extension",
    )
    map: dict[str, str] = Field(
        default_factory=dict,
        description="target -> source column: question (or prompt), answer, messages",
    )
    split: str | None = Field(
        None, description="the split to read (default: train, or the only one)"
    )
    subset: str | None = Field(
        None,
        description="a Hub data set's configuration (e.g. main for openai/gsm8k); default: "
        "its only or default one",
    )
    shuffle: bool = Field(False, description="shuffle the rows (seeded by the run's seed)")
    limit: int | None = Field(None, ge=1, description="use at most this many rows")
    eval_split: str | None = Field(
        None, description="a split of the source held out for evaluation"
    )
    eval_size: int | None = Field(
        None, ge=1, description="rows held out of the train rows for evaluation (seeded)"
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_path(cls, value: Any) -> Any:
        """A bare string (or path) is the path alone."""
        return {"path": value} if isinstance(value, str | Path) else value

    @field_validator("path", mode="before")
    @classmethod
    def _as_written(cls, value: Any) -> Any:
        """``./org/dataset`` stays a local path (``Path`` alone would make a Hub name of it)."""
        return as_written(value) if isinstance(value, str) else value

    @field_validator("map")
    @classmethod
    def _targets(cls, value: dict[str, str]) -> dict[str, str]:
        problem = map_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_eval(self) -> DataConfig:
        if self.eval_split is not None and self.eval_size is not None:
            raise ValueError("eval_split and eval_size both choose the eval rows: give one")
        return self

    def load_splits(self, seed: int = 0) -> Splits:
        """``(train, eval)`` examples (``loomrl.data.load_splits`` with these options)."""
        return load_splits(
            self.path, map=self.map, split=self.split, shuffle=self.shuffle, seed=seed,
            limit=self.limit, format=self.format, eval_split=self.eval_split,
            eval_size=self.eval_size, subset=self.subset,
        )  # fmt: skip

    def load(self, seed: int = 0) -> list[Example]:
        """The train examples (``loomrl.data.load`` with these options)."""
        return self.load_splits(seed).train
