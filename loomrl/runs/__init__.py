"""Trajectories files and run directories' contents: ``config.toml``, trajectories
(Parquet, schema in ``loomrl.runs.schema``), ``metrics.json``, ``report.md``."""

from loomrl.runs.read import load_images, load_trajectories, read_trajectories
from loomrl.runs.schema import IMAGE_SCHEMA, SEGMENT_TYPE, TRAJECTORY_SCHEMA
from loomrl.runs.write import (
    images_path,
    toml_ready,
    trajectory_table,
    write_run,
    write_trajectories,
)

__all__ = [
    "IMAGE_SCHEMA", "SEGMENT_TYPE", "TRAJECTORY_SCHEMA", "images_path", "load_images",
    "load_trajectories", "read_trajectories", "toml_ready", "trajectory_table", "write_run",
    "write_trajectories",
]  # fmt: skip
