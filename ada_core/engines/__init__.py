"""Engines behind the `RolloutEngine` protocol and the update engine.

- `transformers_engine.TransformersRolloutEngine`: in-process batched sampling (the CPU default).
- `deepspeed_engine.DeepSpeedUpdateEngine`: PPO-clip updates with DeepSpeed (gloo on CPU).

Submodules are imported directly, so importing one engine never pays for DeepSpeed's import.
"""
