"""PromptSource: distinct prompts per batch, epochs reshuffle, and the cursor resumes exactly."""

import pytest

from ada_core.data import PromptSource
from ada_core.records import Prompt


def _prompts(n):
    return [Prompt(id=f"p{i}", text=f"{i}+0=", answer=str(i)) for i in range(n)]


def test_batches_are_distinct_across_an_epoch_boundary():
    source = PromptSource(_prompts(10), seed=3)
    for _ in range(12):  # 10 prompts, 4 per batch: every third batch would straddle an epoch
        ids = [p.id for p in source.take(4)]
        assert len(set(ids)) == 4


def test_cursor_resumes_on_the_same_next_prompts():
    source = PromptSource(_prompts(10), seed=1)
    source.take(4), source.take(4), source.take(4)
    saved = source.state_dict()
    expected = [p.id for p in source.take(4)]
    restored = PromptSource(_prompts(10), seed=99)
    restored.load_state_dict(saved)
    assert [p.id for p in restored.take(4)] == expected


def test_bad_requests_are_clear_errors():
    with pytest.raises(ValueError, match="exceeds the 3 training prompts"):
        PromptSource(_prompts(3)).take(4)
    source = PromptSource(_prompts(3))
    with pytest.raises(ValueError, match="same dataset"):
        source.load_state_dict({**PromptSource(_prompts(5)).state_dict()})
