"""Opens a sandbox session that starts a grandchild, prints the session's marker and
working directory, then SIGKILLs itself: nothing of the session may survive it
(tests/sandbox/test_attacks.py)."""

import asyncio
import os
import signal
import sys

from loomrl.sandbox import Sandbox


async def main(mode: str) -> None:
    sb = Sandbox(isolation=mode, pool_size=1)
    session = await sb.session()
    result = await session.run(
        "import os, subprocess\n"
        "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(os.environ['LOOMRL_SANDBOX'], os.getcwd())"
    )
    print(result.output.strip(), flush=True)  # the marker and the working directory
    await asyncio.sleep(0.3)  # the pool's spare interpreter is up too
    os.kill(os.getpid(), signal.SIGKILL)


asyncio.run(main(sys.argv[1]))
