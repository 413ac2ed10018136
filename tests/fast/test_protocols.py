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


# --- issue 26 finding 15: the trainer and the sampler read only what the protocols declare ---------------
def test_the_loop_and_the_sampler_probe_no_engine_for_undeclared_attributes():
    """What the loop and the samplers read on an engine is declared in ada_core/protocols.py (a pool's
    per-server meters: `RolloutEngine.server_meters`; occupancy: `RolloutEngine.meter`); no getattr or
    hasattr probe for an attribute an engine may or may not have."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "ada_core"
    probes = []
    for folder in ("training", "sampling"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("getattr", "hasattr"):
                    probes.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not probes, "declare what these read in ada_core/protocols.py:\n" + "\n".join(probes)


def test_rollout_engines_declare_their_meters():
    from ada_core.engines.rank_rollout import RankRolloutEngine
    from ada_core.engines.transformers_engine import TransformersRolloutEngine
    from ada_core.engines.vllm_engine import VLLMRolloutEngine
    from ada_core.engines.vllm_pool import VLLMServerPool
    from ada_core.occupancy import OccupancyMeter
    from ada_core.protocols import RolloutEngine
    from ada_core.sampling.simulate import BernoulliEngine

    for engine in (RankRolloutEngine, TransformersRolloutEngine, VLLMRolloutEngine, VLLMServerPool, BernoulliEngine):
        assert RolloutEngine in engine.__mro__, engine  # so `meter` and `server_meters` exist on each
    assert BernoulliEngine().server_meters() == [] and BernoulliEngine().meter is None
    metered = BernoulliEngine()
    metered.meter = OccupancyMeter(4)
    assert metered.server_meters() == [metered.meter]
    pool = object.__new__(VLLMServerPool)  # no servers: only what server_meters reads
    pool.members = [metered, BernoulliEngine()]
    pool.members[1].meter = OccupancyMeter(2)
    assert VLLMServerPool.server_meters(pool) == [m.meter for m in pool.members]
