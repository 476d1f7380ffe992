"""Environments on Ray actors meet the rollout's chat template too: a ``ToolEnv`` with
``parser = "auto"`` on each actor chooses the parser the template calls for."""

from __future__ import annotations

import pytest
from families import FAMILIES

from loomrl.distributed.env_actor import RayEnvironment

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(120)]


async def test_every_actors_tool_parser_follows_the_template(ray_cluster):
    env = await RayEnvironment.start("calculator", {}, actors=2)
    try:
        assert env.run_info()["parser"] == "hermes"  # no template yet
        env.use_chat_template(FAMILIES["mistral"].template.read_text())
        openings = [await env.reset({"question": "What is 2 + 2?"}) for _ in range(2)]
        placed = {state.data["_ray_episode"]["slot"] for state in openings}
    finally:
        env.close()
    assert env.run_info() == {"parser": "mistral", "env_actors": 2}
    assert placed == {0, 1}  # both actors answered, each with Mistral's instructions
    assert all("[TOOL_CALLS]" in state.messages[0]["content"] for state in openings)
