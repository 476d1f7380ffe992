"""pass@k: the chance that at least one of ``k`` samples of a problem passes.

The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code", eq. 1): draw ``n >= k`` samples, count the ``c`` that pass, and estimate

    pass@k = 1 - C(n - c, k) / C(n, k)

per problem, then average over problems. Taking the first ``k`` samples instead would be
unbiased too but noisier; ``1 - (1 - c/n)^k`` is biased low. The product form
``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` below is the paper's numerically stable one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` passing samples out of ``n``
    (``0 <= c <= n``, ``1 <= k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every choice of k samples holds a passing one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(passes: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over problems; ``passes[p]`` holds problem ``p``'s samples
    (each a pass or not). Problems with fewer than ``k`` samples are refused."""
    if not passes:
        raise ValueError("pass@k of no problems")
    return math.fsum(pass_at_k(len(p), sum(map(bool, p)), k) for p in passes) / len(passes)
