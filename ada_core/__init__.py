"""Reinforce-Ada and its baselines as a library: no Prefect, no MLflow (those live in flows/).

Read from the bottom layer up; a module imports only from its own layer or the layers below it
(docs/ARCHITECTURE.md draws them, tests/fast/test_layout.py holds every file to it):

    vocabulary  records, protocols, metrics, errors, occupancy, paths, processes
    config      the typed schema, presets and profiles
    rl          advantages, the PPO-clip loss, the math verifier
    sampling    the samplers (GRPO, DAPO, Ada, budgeted), streaming, allocation, simulation
    data        generators, dataset files, the split, the prompt stream, curation
    models      named models, policy loading and prompt encoding, the SFT warm start
    engines     rollout engines (transformers, vLLM, pools, ranks), update engines (DeepSpeed, Ray ranks),
                and `engines.factory`, the one place that chooses them
    run         the run folder: its files, checkpoints, the prompt ledger
    training    the loop: setup, step functions, run_steps
    cli         the `ada` command
"""

__all__ = ["cli", "config", "data", "engines", "errors", "metrics", "models", "occupancy", "paths", "processes",
           "protocols", "records", "rl", "run", "sampling", "training"]
