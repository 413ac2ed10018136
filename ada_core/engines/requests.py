"""What every rollout engine checks before it generates, and how it seeds each row.

Row (request i, copy j) of a call draws from its own seed `row_seed(call seed, i, j)`, so the same call
seed gives the same samples on every engine, whatever the batching or the number of servers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ada_core.protocols import SamplingParams
from ada_core.records import Prompt


def check_requests(requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams) -> None:
    """The checks every rollout engine makes before generating: valid sampling, encoded prompts, k >= 0."""
    check_sampling(sampling)
    for prompt, k in requests:
        if not prompt.prompt_ids:
            raise ValueError(f"prompt {prompt.id}: prompt_ids is empty; encode prompts before generating")
        if k < 0:
            raise ValueError(f"prompt {prompt.id}: requested k={k} samples; k must be >= 0")


def check_sampling(sampling: SamplingParams) -> None:
    if sampling.temperature <= 0:
        raise ValueError(f"sampling.temperature must be > 0, got {sampling.temperature} (greedy is not supported)")
    if not 0.0 < sampling.top_p <= 1.0:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.max_tokens < 1:
        raise ValueError(f"sampling.max_tokens must be >= 1, got {sampling.max_tokens}")


def row_seed(base_seed: int, request: int, copy: int) -> int:
    digest = hashlib.blake2b(f"{base_seed}:{request}:{copy}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
