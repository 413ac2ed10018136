"""Engines behind the `RolloutEngine` and `UpdateEngine` protocols (ada_core/protocols.py).

- `factory`: the one place that chooses a run's update engine (1 rank or N) and rollout engine.
- `requests`: the checks and per-row seeding every rollout engine shares.
- `transformers_engine.TransformersRolloutEngine`: in-process batched sampling (the CPU default).
- `vllm_engine.VLLMRolloutEngine`: a vLLM server over HTTP, with once-per-step weight sync;
  `vllm_server.VLLMServer` launches that server from its own environment (`make vllm-env`);
  `vllm_stream.VLLMSampleStreamer`: its per-sample requests for `sampler.schedule: streaming`.
- `vllm_pool.VLLMServerPool`: several vLLM servers as one engine (dispatch, parallel sync, failover).
- `deepspeed_engine.DeepSpeedUpdateEngine`: PPO-clip updates with DeepSpeed (gloo on CPU);
  `update_state`: its state file (tensors and plain values only) and reference policy;
  `rendezvous`: how its process group meets, and the network interface gloo and NCCL take.
- `update_plan`: the driver's plan of an update (mini-batches, rank shares, global loss denominators).
- `rank_group.RankGroup`: N DeepSpeed ranks as Ray actors, the same interface as one update engine;
  `rank_worker.RankWorker` is the actor each rank runs, `rank_worker.placement` where the ranks go;
  `rank_rollout.RankRolloutEngine` splits each round across those ranks; `ray_cluster.start_ray` starts
  or joins their Ray, and `lifeline.Lifeline` ends a Ray it started when the driver dies.

Submodules are imported directly, so importing one engine never pays for another's imports (DeepSpeed, httpx).
"""

__all__ = ["deepspeed_engine", "factory", "lifeline", "rank_group", "rank_rollout", "rank_worker", "ray_cluster",
           "rendezvous", "requests", "transformers_engine", "update_plan", "update_state", "vllm_engine", "vllm_pool",
           "vllm_server", "vllm_stream"]
