"""``loomrl experience``: a run's trajectories shaped as ``loomrl train`` shapes them
(the same pipeline, ``build_experience``, with the same shaping fields), written as
``experience.parquet`` and ``experience_stats.json``.

Everything a request can get wrong is found before anything is written: the shaping and
estimator (``check_shaping``), the source file's schema, and a run with no trajectory to
use.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from loomrl.experience.files import check_shaping, check_trajectory_file, experience_table
from loomrl.experience.maker import UNUSABLE
from loomrl.experience.pipeline import build_experience
from loomrl.experience.shaping_config import ShapingConfig
from loomrl.rundir import RunDir
from loomrl.runs import images_path, load_trajectories


def trajectory_source(source: Path) -> Path:
    """The trajectories file ``source`` names: a Parquet file, or a `loomrl rollout` run
    directory's ``trajectories.parquet``; ``FileNotFoundError`` saying what to pass."""
    if source.is_file():
        return source
    run = RunDir(source)
    found = run.trajectories
    if not found.is_file() and run.steps.is_dir():
        raise FileNotFoundError(
            f"{found} not found: {source} is a `loomrl train` run, which keeps each step's "
            "trajectories in trajectories/step-NNNNNN.parquet: pass one of those files "
            "(with --out DIR)"
        )
    if not found.is_file():
        raise FileNotFoundError(f"{found} not found: is {source} a loomrl run directory?")
    return found


def run_experience(
    source: Path, shaping: ShapingConfig, *, out: Path | None = None
) -> tuple[Path, dict[str, Any]]:
    """Read the trajectories ``source`` names (``trajectory_source``), shape them as
    ``loomrl train`` does (``build_experience`` with ``shaping``; a running reward
    normalisation starts from this file's rewards); write ``experience.parquet`` and
    ``experience_stats.json`` (to ``out``, default the run directory; a file needs one)
    and return the file and the stats.

    A source with no trajectory to compute advantages for (all failed, or every group
    dropped by ``drop_zero_variance``) raises ``ValueError`` saying why; nothing is
    written then."""
    check_shaping(shaping)
    path = trajectory_source(source)
    if out is None and path == source:
        raise ValueError(f"{source} is a trajectories file: say where to write (--out DIR)")
    check_trajectory_file(path)
    exp = build_experience(load_trajectories(path), shaping)
    if not exp.trajectories:
        raise ValueError(f"{path}: {_nothing_usable(exp.stats)}")
    bad = [i for i, row in enumerate(exp.advantages) if not all(map(math.isfinite, row))]
    if bad:
        raise ValueError(
            f"estimator {shaping.estimator!r} gave non-finite advantages in rows {bad[:5]}"
        )
    target = RunDir(out or source)
    target.path.mkdir(parents=True, exist_ok=True)
    written = target.experience
    tmp = written.with_suffix(".parquet.tmp")
    pq.write_table(experience_table(exp), tmp)
    tmp.replace(written)
    images = images_path(path)
    if images.is_file():  # what the hashes refer to, as the experience file's side table
        images_path(written).parent.mkdir(exist_ok=True)
        shutil.copyfile(images, images_path(written))
    stats = {"source": str(path), **exp.stats, "shaping": exp.metrics}
    target.experience_stats.write_text(json.dumps(stats, indent=2) + "\n")
    return written, stats


def _nothing_usable(stats: Mapping[str, Any]) -> str:
    """Why no trajectory is left to train on, from ``make_experience``'s stats."""
    total = stats["trajectories_in"]
    if total == 0:
        return "no trajectories: the run produced none"
    left_out = stats["left_out_by_status"]
    if sum(left_out.values()) == total:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(left_out.items()))
        return (
            f"no usable trajectory: all {total} ended as "
            f"{'/'.join(sorted(str(s) for s in UNUSABLE))} ({counts}); "
            "see their 'error' column"
        )
    return (
        f"no usable trajectory: --drop-zero-variance dropped all "
        f"{stats['zero_variance_groups_dropped']} groups (every group's rewards agree)"
        + (f" and {sum(left_out.values())} trajectories failed" if left_out else "")
    )
