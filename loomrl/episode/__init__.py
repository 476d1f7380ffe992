"""One episode's play: the context, the turn loop, pacing, scoring and metrics that the
producer (and so ``rollout()``) runs each sample through."""
