"""Engines behind the `RolloutEngine` protocol and the update engine.

- `transformers_engine.TransformersRolloutEngine`: in-process batched sampling (the CPU default).
- `vllm_engine.VLLMRolloutEngine`: a vLLM server over HTTP, with once-per-step weight sync;
  `vllm_server.VLLMServer` launches that server from its own environment (`make vllm-env`).
- `vllm_pool.VLLMServerPool`: several vLLM servers as one engine (dispatch, parallel sync, failover).
- `deepspeed_engine.DeepSpeedUpdateEngine`: PPO-clip updates with DeepSpeed (gloo on CPU).
- `update_plan`: the driver's plan of an update (mini-batches, rank shares, global loss denominators).
- `rank_group.RankGroup`: N DeepSpeed ranks as Ray actors, the same interface as one update engine;
  `rank_group.build_update_engine` picks one or the other from `distributed.num_ranks`.

Submodules are imported directly, so importing one engine never pays for another's imports (DeepSpeed, httpx).
"""
