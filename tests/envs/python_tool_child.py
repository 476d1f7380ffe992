"""Plays python_tool episodes whose code sleeps, prints its sandbox marker once the
interpreters run, then SIGKILLs itself mid-rollout: no interpreter may outlive it
(tests/envs/test_python_tool_env.py)."""

import asyncio
import json
import os
import signal
import sys
import threading

from transformers import AutoTokenizer

from loomrl import rollout
from loomrl.engines.scripted import ScriptedEngine
from loomrl.envs.python_tool import PythonToolEnv
from loomrl.models import DEFAULT_MODEL, resolve

CODE = "import time\nprint('sleeping', flush=True)\ntime.sleep(300)"
CALL = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": CODE}}) + "</tool_call>"


async def main(mode: str) -> None:
    env = PythonToolEnv(sandbox={"isolation": mode, "wall_s": 120, "pool_size": 1})
    engine = ScriptedEngine(
        lambda ids, p: CALL, tokenizer=AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    )

    def kill_when_running() -> None:
        while env.sandbox.stats["calls"] < 2:
            threading.Event().wait(0.05)
        print("running", flush=True)
        threading.Event().wait(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill_when_running, daemon=True).start()
    examples = env.dataset(2)
    await rollout(engine, env, examples, n=1)


asyncio.run(main(sys.argv[1]))
