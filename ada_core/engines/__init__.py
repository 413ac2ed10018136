"""Engines behind the `RolloutEngine` protocol and the update engine.

- `transformers_engine.TransformersRolloutEngine`: in-process batched sampling (the CPU default).
- `vllm_engine.VLLMRolloutEngine`: a vLLM server over HTTP, with once-per-step weight sync;
  `vllm_server.VLLMServer` launches that server from its own environment (`make vllm-env`).
- `deepspeed_engine.DeepSpeedUpdateEngine`: PPO-clip updates with DeepSpeed (gloo on CPU).

Submodules are imported directly, so importing one engine never pays for another's imports (DeepSpeed, httpx).
"""
