"""Weight updates that keep the generations in flight (vLLM's keep mode, where the
engine supports it, with ``partial_rollout``): nothing is aborted, a turn that spans an
update comes back as one span per version (ending ``sync``), every span's tokens are
its version's, and the token contract holds. Without ``partial_rollout`` the producer
aborts as before."""

from __future__ import annotations

from typing import Any

import pytest
from producer_helpers import VersionEngine, check_versions, config, let_production_run

from loomrl.engines.scripted import ScriptedEngine
from loomrl.producer import AsyncProducer
from loomrl.types import Completion


class KeepEngine(VersionEngine):
    """A VersionEngine with keep mode: an update switches what each request in flight
    produces from then on to the new version's token, and its completion reports the
    spans (as ``VLLMEngine`` does from vLLM's weight versions)."""

    supports_keep = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cuts: dict[str, list[tuple[int, int]]] = {}  # request -> (token, new version)
        self.started: dict[str, int] = {}
        self.kept_updates = 0

    async def generate(self, prompt_ids, params, request_id=None, **kw) -> Completion:
        self.started[request_id] = self.policy_version
        return await super().generate(prompt_ids, params, request_id, **kw)

    async def update_weights(self, weights: Any, version: int | None = None, *, keep=False):
        if not keep:
            return await super().update_weights(weights, version=version)
        self.kept_updates += 1
        new = self.policy_version + 1 if version is None else version
        word = self.word_ids[new]
        for request in [*self._running.values(), *self._waiting]:
            at = request.produced
            body = len(request.tokens) - (request.tokens[-1] == self.eos_token_id)
            if at < body:  # (a span of EOS alone would name no version to check)
                request.tokens[at:body] = [word] * (body - at)
                self.cuts.setdefault(request.request_id, []).append((at, new))
        self.weight_updates.append(0)
        self.set_policy_version(new)
        return 0.0

    def _completion(self, request_id, prompt_len, tokens, finish, stop_reason) -> Completion:
        out = ScriptedEngine._completion(self, request_id, prompt_len, tokens, finish, stop_reason)
        bounds = [(0, self.started.get(request_id, out.policy_version))]
        for at, version in self.cuts.pop(request_id, []):
            if at >= len(tokens):
                break
            bounds = [*bounds[:-1]] if bounds[-1][0] == at else bounds  # nothing before it
            bounds.append((at, version))
        out.policy_version = bounds[0][1]
        if len(bounds) > 1:
            ends = [b[0] for b in bounds[1:]] + [len(tokens)]
            spans = [(s, e, v) for (s, v), e in zip(bounds, ends, strict=True)]
            out.extra["version_spans"] = spans
        return out


@pytest.mark.parametrize("partial", [True, False])
async def test_updates_keep_what_is_generating_with_partial_rollouts(
    partial, tokenizer, make_producer, talk_task, check_contract
):
    engine = KeepEngine(tokenizer, step_base_s=0.002, reply_len=12, vary=4)
    producer = make_producer(
        AsyncProducer, engine, talk_task(),
        config(max_staleness=4, over_sample_threshold=1.0, partial_rollout=partial),
    )  # fmt: skip
    kept = []
    try:
        for step in range(4):
            for group in await producer.next_batch(step):
                for traj in group.trajectories():
                    check_versions(engine, traj)
                    check_contract(traj)
                    assert traj.span_versions == sorted(traj.span_versions)
                    kept += [traj] if "sync" in traj.finish_reasons else []
                    assert partial or "sync" not in traj.finish_reasons
            await let_production_run(producer, engine)
            await producer.update_weights({}, version=step + 1)
        aborted = engine.aborted_pieces
    finally:
        await engine.close()
    if partial:
        assert engine.kept_updates == 4 and aborted == 0 and kept
        assert producer.progress.continued_spans.get(0, 0) < sum(
            producer.progress.continued_spans.values()
        )  # kept spans count as continued
    else:
        assert engine.kept_updates == 0 and aborted > 0
