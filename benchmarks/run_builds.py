"""How often one ``loomrl train`` run builds its engine and its environments.

Runs ``loomrl train`` through the command line on a two-task config with a held-out
evaluation (``eval_every = 1``) and counts, for the whole command (checks included):

- engines built: vLLM engines (``--engine vllm``: the default model, real vLLM), or the
  scripted engines that stand in for them (``--engine scripted``);
- environments built, per registered environment (every ``loomrl.envs.load``).

A run builds its engine once and each task's environment once (its plan draws the
examples, trains and evaluates with it). ``engine/starts`` in the run's metric rows
says the same from inside the run.

    python benchmarks/run_builds.py [--engine scripted|vllm] [--steps N] [--write]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from _report import write_section

from loomrl.cli import main
from loomrl.envs import registry

CONFIG = """[train]
model = "{model}"
steps = {steps}
prompts_per_step = 2
n = 2
max_tokens = 8
max_len = 256
eval_every = 1
eval_examples = 2
eval_n = 1
checkpoint_every = {steps}
[train.tasks.arith]
env_args = {{ max_operand = 5 }}
[train.tasks.guess_number]
"""


def count_env_builds() -> collections.Counter[str]:
    """Wrap every registered environment's factory with a counter."""
    built: collections.Counter[str] = collections.Counter()
    for name, entry in list(registry._ENVS.items()):
        factory = entry.factory
        if isinstance(factory, str):  # a "module:attribute" reference, imported on use
            factory = registry.resolve(factory)

        def counted(*args: Any, _name: str = name, _f: Any = factory, **kwargs: Any) -> Any:
            built[_name] += 1
            return _f(*args, **kwargs)

        registry._ENVS[name] = dataclasses.replace(entry, factory=counted)
    return built


def count_engine_builds(engine: str) -> list[int]:
    """Count the engines the commands build (scripted ones stand in for vLLM)."""
    from transformers import AutoTokenizer

    from loomrl.engines import _FACTORIES, ScriptedEngine
    from loomrl.models import resolve

    made = [0]
    if engine == "vllm":
        real = _FACTORIES["vllm"]

        def vllm(*args: Any, **kwargs: Any) -> Any:
            made[0] += 1
            return real(*args, **kwargs)

        _FACTORIES["vllm"] = vllm
        return made
    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny-random"))

    def scripted(version: int = 0) -> Any:
        made[0] += 1
        fake = ScriptedEngine(lambda ids, p: "Answer: 3", tokenizer=tokenizer)
        fake.set_policy_version(version)
        return fake

    try:
        from loomrl.run import engines

        engines.build_engine = lambda order: scripted(order.policy_version)
    except ImportError:  # before the run layer: the training loop's own factory
        from loomrl.train import loop

        loop.engine_factory = lambda config: lambda model_dir, version: scripted(version)
    return made


def main_(args: argparse.Namespace) -> None:
    envs = count_env_builds()
    engines = count_engine_builds(args.engine)
    model = "smollm2-135m-instruct" if args.engine == "vllm" else "tiny-random"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "train.toml"
        config.write_text(CONFIG.format(model=model, steps=args.steps))
        out = Path(tmp) / "run"
        code = main(["train", str(config), "--out", str(out)])
        assert code == 0, f"loomrl train exited {code}"
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    starts = [r.get("engine/starts") for r in rows if "reward_mean" in r]
    body = (
        f"`loomrl train` ({args.engine} engine, {model}), 2 tasks (arith, guess_number), "
        f"{args.steps} steps, held-out evaluation every step:\n\n"
        "| what | built |\n|---|---:|\n"
        f"| engines | {engines[0]} |\n"
        + "".join(f"| environment `{name}` | {n} |\n" for name, n in sorted(envs.items()))
        + f"\n`engine/starts` in the run's metric rows: {starts}.\n"
    )
    print(body)
    if args.write:
        write_section("Engine and environment builds of a training run", body)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["scripted", "vllm"], default="scripted")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    main_(parser.parse_args())
