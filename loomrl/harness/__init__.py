"""Agent harnesses: programs that talk to the model through the OpenAI chat API,
trained token-exactly. ``HarnessEnv`` runs one per episode behind a loopback endpoint
(``loomrl.harness.server``); see docs/harness.md."""

from loomrl.harness.env import HarnessEnv, HarnessError, HarnessOutcome
from loomrl.harness.program import HarnessRun, ProgramExit
from loomrl.harness.protocol import RequestError

__all__ = [
    "HarnessEnv",
    "HarnessError",
    "HarnessOutcome",
    "HarnessRun",
    "ProgramExit",
    "RequestError",
]
