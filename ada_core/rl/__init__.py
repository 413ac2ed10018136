"""The learning signal: rewards, advantages and the loss.

- `rewards`: the math-verify verifier (answer extraction, a killable process pool with timeouts).
- `advantages`: group advantages against the whole pool's rewards (GRPO, RLOO, Ada's estimators).
- `losses`: token-level PPO-clip with the TIS weight, KL and entropy terms.

Modules are imported by name: `losses` loads torch, `rewards` math-verify's workers.
"""

__all__ = ["advantages", "losses", "rewards"]
