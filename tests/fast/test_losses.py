"""PPO-clip against values worked out by hand, the aggregation modes, and the REINFORCE identity."""

from __future__ import annotations

import math

import pytest
import torch

from ada_core.config import LossConfig, OptimConfig
from ada_core.rl.losses import (
    AGGREGATIONS,
    effective_mask,
    gather_logprobs,
    ppo_clip_loss,
    token_entropy,
)


def _ratios(*ratios: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, old_logprobs) [1, T] whose exp-difference is each given ratio."""
    old = torch.full((1, len(ratios)), -1.0)
    return old + torch.log(torch.tensor([ratios])), old


def test_hand_computed_two_tokens_positive_advantage():
    # A = +1, eps 0.2 / 0.28. Token 1: ratio 1.5 -> clipped to 1.28 -> loss -1.28 (clipped).
    # Token 2: ratio 0.5 -> min(0.5, 0.8) = 0.5 -> loss -0.5 (a positive advantage is not clipped below).
    # token-mean: (-1.28 - 0.5) / 2 = -0.89; clip_frac 1/2.
    logprobs, old = _ratios(1.5, 0.5)
    loss, diag = ppo_clip_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 2), LossConfig())
    assert loss.item() == pytest.approx(-0.89, abs=1e-6)
    assert diag["clip_frac"] == pytest.approx(0.5)
    assert diag["approx_kl"] == pytest.approx(0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2) / 2, rel=1e-5)


def test_hand_computed_two_tokens_negative_advantage():
    # A = -1. Token 1: ratio 0.5 -> max(0.5, 0.8) = 0.8 (clipped). Token 2: ratio 1.5 -> max(1.5, 1.28) = 1.5.
    # token-mean: (0.8 + 1.5) / 2 = 1.15; clip_frac 1/2.
    logprobs, old = _ratios(0.5, 1.5)
    loss, diag = ppo_clip_loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 2), LossConfig())
    assert loss.item() == pytest.approx(1.15, abs=1e-6)
    assert diag["clip_frac"] == pytest.approx(0.5)


def test_dual_clip_bounds_negative_advantages_only():
    # ratio 20: A = -1 gives 20 unbounded, 10 with dual-clip c = 10; A = +1 clips to -1.28 either way.
    logprobs, old = _ratios(20.0)
    neg_dual, _ = ppo_clip_loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 1), LossConfig(dual_clip_c=10.0))
    neg_plain, _ = ppo_clip_loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 1), LossConfig(dual_clip_c=None))
    pos_dual, _ = ppo_clip_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 1), LossConfig(dual_clip_c=10.0))
    assert neg_dual.item() == pytest.approx(10.0, rel=1e-5)
    assert neg_plain.item() == pytest.approx(20.0, rel=1e-5)
    assert pos_dual.item() == pytest.approx(-1.28, rel=1e-5)


def test_aggregation_modes_and_micro_batch_totals():
    # ratio 1, so per-token loss = -A. Row 0: A = +1 over 1 token; row 1: A = -2 over 3 tokens.
    # token-mean: (-1 + 3 * 2) / 4 = 1.25; seq-mean-token-mean: (-1 + 2) / 2 = 0.5;
    # seq-mean-token-sum-norm (constant length 3): (-1 + 6) / (2 * 3) = 5/6.
    logprobs = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    expected = {"token-mean": 1.25, "seq-mean-token-mean": 0.5, "seq-mean-token-sum-norm": 5 / 6}
    assert set(expected) == set(AGGREGATIONS)
    for mode, value in expected.items():
        cfg = LossConfig(aggregation=mode)
        whole, _ = ppo_clip_loss(logprobs, logprobs, adv, mask, cfg)
        assert whole.item() == pytest.approx(value, abs=1e-6), mode
        # Split into two micro-batches with the mini-batch totals: the parts sum to the whole.
        parts = [ppo_clip_loss(logprobs[i : i + 1], logprobs[i : i + 1], adv[i : i + 1], mask[i : i + 1], cfg,
                               num_tokens=4.0, num_seqs=2.0, max_len=3)[0] for i in range(2)]
        assert sum(p.item() for p in parts) == pytest.approx(value, abs=1e-6), mode


def test_ratio_one_gradient_is_reinforce_with_baseline():
    # At ratio 1 (no clipping active), d loss / d logprob_t = -A / num_tokens under token-mean.
    torch.manual_seed(0)
    old = -torch.rand(3, 4)
    logprobs = old.clone().requires_grad_(True)
    adv = torch.tensor([0.5, -1.0, 2.0])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = ppo_clip_loss(logprobs, old, adv, mask, LossConfig())
    loss.backward()
    expected = -adv.unsqueeze(-1) * mask / mask.sum()
    assert torch.allclose(logprobs.grad, expected, atol=1e-7)


def test_effective_mask_options():
    mask = torch.ones(3, 2)
    adv = torch.tensor([1.0, 0.0, -1.0])
    truncated = torch.tensor([False, False, True])
    assert torch.equal(effective_mask(mask, adv, truncated, LossConfig()), mask)
    cut = effective_mask(mask, adv, truncated, LossConfig(mask_truncated=True, exclude_zero_adv=True))
    assert cut.tolist() == [[1, 1], [0, 0], [0, 0]]


def test_entropy_bonus_and_reference_kl():
    logits = torch.zeros(1, 2, 4)  # uniform over 4 tokens: entropy log 4
    entropy = token_entropy(logits)
    assert torch.allclose(entropy, torch.full((1, 2), math.log(4)))
    labels = torch.tensor([[1, 3]])
    logprobs = gather_logprobs(logits, labels)
    assert torch.allclose(logprobs, torch.full((1, 2), -math.log(4)))
    mask, adv = torch.ones(1, 2), torch.tensor([0.0])
    loss, diag = ppo_clip_loss(logprobs, logprobs, adv, mask, LossConfig(entropy_coef=0.1), entropy=entropy,
                               ref_logprobs=logprobs)
    assert loss.item() == pytest.approx(-0.1 * math.log(4), abs=1e-6)
    assert diag["entropy"] == pytest.approx(math.log(4)) and diag["kl_ref"] == 0.0
    # k3 KL at a log-ratio of 1: e^{-1} + 1 - 1 = e^{-1}, added with kl_coef.
    loss, diag = ppo_clip_loss(logprobs, logprobs, adv, mask, LossConfig(kl_coef=0.5), ref_logprobs=logprobs - 1.0)
    assert diag["kl_ref"] == pytest.approx(math.exp(-1.0), rel=1e-5)
    assert loss.item() == pytest.approx(0.5 * math.exp(-1.0), rel=1e-5)


def test_tis_weights_each_token_by_the_capped_importance_ratio():
    # Current == old (PPO ratio 1, nothing clipped), A = +1. old - behaviour = log 1.5 and log 4, cap 2:
    # weights 1.5 and 2 (capped), per-token losses -1.5 and -2, token-mean -1.75, half the tokens capped.
    # The weight is a constant: d loss / d logprob_t = -A * w_t / 2 = [-0.75, -1.0].
    old = torch.full((1, 2), -1.0)
    behaviour = old - torch.log(torch.tensor([[1.5, 4.0]]))
    logprobs = old.clone().requires_grad_(True)
    loss, diag = ppo_clip_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 2), LossConfig(tis_cap=2.0),
                               behaviour_logprobs=behaviour)
    assert loss.item() == pytest.approx(-1.75, abs=1e-6)
    assert diag["tis_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.75, -1.0]]), atol=1e-6)


def test_tis_weight_applies_after_dual_clip():
    # A = -1, PPO ratio 20: dual-clip bounds the loss at 10; an importance weight of 1.5 (under the cap) makes it 15.
    logprobs, old = _ratios(20.0)
    behaviour = old - math.log(1.5)
    loss, diag = ppo_clip_loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 1),
                               LossConfig(dual_clip_c=10.0, tis_cap=2.0), behaviour_logprobs=behaviour)
    assert loss.item() == pytest.approx(15.0, rel=1e-5)
    assert diag["tis_clip_frac"] == 0.0


def test_tis_off_leaves_loss_and_gradient_unchanged():
    torch.manual_seed(1)
    old = -torch.rand(3, 4) * 3
    behaviour = old + torch.randn(3, 4)  # far off-policy: ignored while tis_cap is None
    adv, mask = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    results = []
    for cfg, extra in ((LossConfig(), {}), (LossConfig(), {"behaviour_logprobs": behaviour}),
                       (LossConfig(tis_cap=2.0), {"behaviour_logprobs": old})):  # on-policy: every weight 1
        logprobs = (old + 0.3 * torch.randn(3, 4, generator=torch.Generator().manual_seed(2))).requires_grad_(True)
        loss, diag = ppo_clip_loss(logprobs, old, adv, mask, cfg, **extra)
        loss.backward()
        results.append((loss.item(), logprobs.grad, diag))
    (base, grad, diag), *others = results
    assert diag["tis_clip_frac"] == 0.0
    for value, other_grad, other_diag in others:
        assert value == pytest.approx(base, abs=1e-6)
        assert torch.allclose(other_grad, grad, atol=1e-7)
        assert other_diag["clip_frac"] == diag["clip_frac"] and other_diag["tis_clip_frac"] == 0.0


def test_tis_needs_behaviour_logprobs_and_a_cap_of_at_least_one():
    logprobs, old = _ratios(1.0)
    with pytest.raises(ValueError, match="loss.tis_cap is set but no behaviour_logprobs"):
        ppo_clip_loss(logprobs, old, torch.tensor([1.0]), torch.ones(1, 1), LossConfig(tis_cap=2.0))
    with pytest.raises(ValueError, match="tis_cap"):
        LossConfig(tis_cap=0.5)
    assert LossConfig(tis_cap=1.0).tis_cap == 1.0 and LossConfig().tis_cap is None


# --- the three details settled against verl (docs/ALGORITHM.md, "Loss denominators") -------------


def test_fully_masked_rows_count_in_no_denominator():
    # Row 1 has advantage 0 and exclude_zero_adv masks it: every mode gives the loss of rows 0 and 2
    # alone, whether the totals come from this micro-batch (the default) or from the planner.
    from ada_core.engines.update_plan import plan_update

    logprobs = torch.zeros(3, 3)
    adv = torch.tensor([1.0, 0.0, -2.0])
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1], [1, 1, 1]])
    for mode in AGGREGATIONS:
        cfg = LossConfig(aggregation=mode, exclude_zero_adv=True)
        masked = effective_mask(mask, adv, None, cfg)
        loss, _ = ppo_clip_loss(logprobs, logprobs, adv, masked, cfg, max_len=3)
        alone, _ = ppo_clip_loss(logprobs[[0, 2]], logprobs[[0, 2]], adv[[0, 2]], mask[[0, 2]], cfg, max_len=3)
        assert loss.item() == pytest.approx(alone.item(), abs=1e-6), mode
    seqs = [{"group": 0, "prompt": [1], "completion": [5] * int(n), "advantage": float(a), "truncated": False}
            for n, a in zip(mask.sum(-1), adv)]
    den = plan_update(seqs, 1, torch.Generator().manual_seed(0), OptimConfig(), LossConfig(exclude_zero_adv=True),
                      world_size=2, max_response_len=3)[0].denominators
    assert (den.num_tokens, den.num_seqs) == (4.0, 2.0)


def test_dr_grpo_divides_by_the_constant_max_tokens():
    # Responses of 1 and 2 tokens, max_tokens 8: (-1 - 2 * 1) / (2 * 8), not / (2 * 2) as the
    # mini-batch's longest response would give; the planner hands every step the same 8.
    from ada_core.engines.update_plan import plan_update

    cfg = LossConfig(aggregation="seq-mean-token-sum-norm")
    logprobs = torch.zeros(2, 2)
    loss, _ = ppo_clip_loss(logprobs, logprobs, torch.tensor([1.0, 1.0]), torch.tensor([[1.0, 0], [1, 1]]), cfg,
                            max_len=8)
    assert loss.item() == pytest.approx(-3 / 16, abs=1e-7)
    seqs = [{"group": g, "prompt": [1], "completion": [5] * n, "advantage": 1.0, "truncated": False}
            for g, n in enumerate([1, 2, 5])]
    plan = plan_update(seqs, 3, torch.Generator().manual_seed(0), OptimConfig(mini_batches=3), cfg, world_size=1,
                       max_response_len=8)
    assert [s.denominators.max_len for s in plan] == [8, 8, 8]


def test_k3_kl_is_clamped_per_token_to_ten():
    # Token 0: ref - logprob = 1 -> k3 = e - 2 ~ 0.718 (kept). Token 1: 5 -> e^5 - 6 ~ 142 -> 10, no gradient.
    ref = torch.tensor([[0.0, 0.0]])
    logprobs = torch.tensor([[-1.0, -5.0]], requires_grad=True)
    cfg = LossConfig(kl_coef=1.0)
    loss, diag = ppo_clip_loss(logprobs, logprobs.detach(), torch.tensor([0.0]), torch.ones(1, 2), cfg,
                               ref_logprobs=ref)
    assert diag["kl_ref"] == pytest.approx((math.e - 2 + 10.0) / 2, rel=1e-5)
    loss.backward()
    assert logprobs.grad[0, 1].item() == 0.0 and logprobs.grad[0, 0].item() != 0.0
