"""A verifiers.v1 tool taskset for loomrl's adapter tests: sums with an ``add`` tool.

The tool is an MCP server (``vf.Toolset``) that verifiers starts as a subprocess,
``python -m loomrl_vf_add`` (so this module must be importable there too). Reward
``correct`` (weight 1): the final reply holds the sum; metric ``used_tool``.
"""

from __future__ import annotations

import verifiers.v1 as vf
from pydantic import Field

PROBLEMS = ((2, 3), (20, 22))


class AddData(vf.TaskData):
    answer: str


class AddTask(vf.Task[AddData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace) -> float:
        return 1.0 if self.data.answer in (trace.last_reply or "") else 0.0

    @vf.metric
    async def used_tool(self, trace) -> float:
        return float(any(node.message.role == "tool" for node in trace.nodes))


class AddToolsetConfig(vf.ToolsetConfig):
    pass


class AddToolset(vf.Toolset[AddToolsetConfig, vf.State]):
    TOOL_PREFIX = "calc"  # the model sees calc_add

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class AddTasksetConfig(vf.TasksetConfig):
    tools: AddToolsetConfig = Field(default_factory=AddToolsetConfig)


class AddTaskset(vf.Taskset[AddTask, AddTasksetConfig]):
    @classmethod
    def toolsets(cls, config):  # one tool server per serving env, shared by its tasks
        return [AddToolset(config.tools)]

    def load(self):
        for i, (a, b) in enumerate(PROBLEMS):
            data = AddData(
                name=f"add#{i}", prompt=f"What is {a} + {b}? Use the tool.", answer=str(a + b)
            )
            yield AddTask(data, self.config.task)


async def broken_reward(trace) -> float:
    """A reward that raises: plugged by config in the adapter's failure test."""
    raise RuntimeError("the scorer broke")


__all__ = ["AddData", "AddTask", "AddTaskset", "AddTasksetConfig"]

if __name__ == "__main__":  # the tool server subprocess
    AddToolset.run()
