"""The `ada` command line. One typer app; each command is a thin call into ada_core."""

from __future__ import annotations

import json
from pathlib import Path

import typer

# Every bad input (config value, YAML file, dataset file or row) exits with this code and one clean
# line on stderr, the same code typer gives a bad option.
INPUT_ERROR_EXIT = 2
# A run that started and failed outside its input (ada_core.errors.RunFailure: a training rank died):
# one line naming what failed and where its log is.
RUN_FAILURE_EXIT = 1

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Reinforce-Ada experiment platform.")


@app.callback()
def main() -> None:
    """Adaptive-sampling RL post-training (Reinforce-Ada): simulate, train, compare."""
    # A callback keeps `ada <command>` a command group even while only one command is registered.


@app.command()
def simulate(
    prompts: int = typer.Option(512, min=1, help="Prompts per step (B)."),
    steps: int = typer.Option(4, min=1, help="Steps (repeats) per method."),
    seed: int = typer.Option(0, help="Seeds the pass rates, the prompt order and every sampler call."),
    frac_zero: float = typer.Option(0.2, min=0.0, max=1.0, help="Share of unsolvable prompts (p = 0)."),
    frac_one: float = typer.Option(0.15, min=0.0, max=1.0, help="Share of solved prompts (p = 1)."),
    beta_a: float = typer.Option(0.5, min=1e-6, help="Beta(a, b) of the other pass rates: a."),
    beta_b: float = typer.Option(0.5, min=1e-6, help="Beta(a, b) of the other pass rates: b."),
    pool: int | None = typer.Option(
        None, min=1, help="Prompts in the dataset (default 8 x --prompts: fresh prompts every step). A pool smaller "
                          "than --prompts x --steps is reused over epochs, so history can inform the budgeted samplers."),
    curation_k: int = typer.Option(0, min=0, help="Give every prompt a curated pass rate measured from this many draws."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the per-method summary here."),
    png_path: Path | None = typer.Option(None, "--png", help="Write the plot here."),
) -> None:
    """Compare the samplers on a Bernoulli engine with known pass rates (no model, seconds)."""
    from ada_core.sampling.simulate import (
        DifficultyMix,
        format_table,
        plot,
        run_simulation,
    )

    if frac_zero + frac_one > 1.0:
        raise typer.BadParameter(f"--frac-zero + --frac-one = {frac_zero + frac_one} must be <= 1")
    _load_sampler_plugins()  # a sampler of your own runs too (docs/SAMPLERS.md)
    mix = DifficultyMix(frac_zero=frac_zero, frac_one=frac_one, beta_a=beta_a, beta_b=beta_b)
    if pool is not None and pool < prompts:
        raise typer.BadParameter(f"--pool {pool} must be >= --prompts {prompts}")
    results = run_simulation(num_prompts=prompts, steps=steps, seed=seed, mix=mix, pool=pool, curation_k=curation_k)
    typer.echo(
        f"{prompts} prompts x {steps} steps, seed {seed}, pool {pool or 8 * prompts}, curation_k {curation_k}; pass rates: {frac_zero:.0%} p=0, {frac_one:.0%} p=1, "
        f"rest Beta({beta_a:g}, {beta_b:g}); expected zero-variance groups at n=4: {mix.zero_variance_frac(4):.1%}"
    )
    typer.echo(format_table(results))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "config": {"prompts": prompts, "steps": steps, "seed": seed, "pool": pool, "curation_k": curation_k,
                       "difficulty": mix.__dict__},
            "methods": results,
        }
        json_path.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
        typer.echo(f"wrote {json_path}")
    if png_path is not None:
        png_path.parent.mkdir(parents=True, exist_ok=True)
        plot(results, str(png_path))
        typer.echo(f"wrote {png_path}")


def _load_sampler_plugins() -> None:
    """Import the registered sampler plugins ($ADA_SAMPLERS, entry points); a broken one exits 2 in one line."""
    from ada_core.config.registry import PluginError, load_plugins

    try:
        load_plugins()
    except PluginError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(INPUT_ERROR_EXIT) from None


# The config fields `ada train` has a flag of its own for.
FLAG_OF = {"preset": "--preset", "profile": "--profile", "model": "--model", "steps": "--steps", "seed": "--seed",
           "data.dataset": "--dataset", "rollout.engine": "--engine"}


def check_set_against_flags(sets: dict, flags: dict) -> None:
    """Refuse a `--set` that another flag contradicts (`--steps 8 --set steps=40`), or that names a preset or
    profile (they choose defaults, with --preset and --profile): one of the two would be silently dropped."""
    from ada_core.config import flatten_dotted
    from ada_core.errors import InputError

    for key, value in flatten_dotted(sets).items():
        if key in ("preset", "profile"):
            raise InputError(f"--set {key}={value}: a {key} is chosen with {FLAG_OF[key]} {value}, not --set")
        given = flags.get(key)
        if key in FLAG_OF and given is not None and given != value:
            raise InputError(f"--set {key}={value} contradicts {FLAG_OF[key]} {given}: both set {key}; give one")


@app.command()
def train(
    preset: str | None = typer.Option(None, help="Algorithm preset: grpo, grpo-n8, grpo-n16, dapo, ada-pos, "
                                                 "ada-balance, ada-est, ada-posterior, ada-budget, or one a sampler "
                                                 "of yours registers ($ADA_SAMPLERS; docs/SAMPLERS.md) (default "
                                                 "grpo; with --resume, the run's own)."),
    profile: str | None = typer.Option(None, help="Scale profile: tiny, testbed, smollm2-135m, paper (default tiny; with "
                                                  "--resume, the run's own)."),
    model: str | None = typer.Option(
        None, help="tiny, tiny-l4, smollm2-135m, a local HF model folder, or a hub id org/name[@revision] (default: the profile's)."),
    steps: int | None = typer.Option(None, min=1, help="Training steps (default: the profile's)."),
    output_dir: Path | None = typer.Option(
        None, help="Run directory (default: the --resume folder, else $ADA_HOME/runs/<preset>-seed<seed>). "
                   "A folder that already holds a run is refused unless it is the one resumed or --overwrite is given; "
                   "one left by a run that stopped before its first checkpoint is taken, its leftovers moved aside."),
    resume: Path | None = typer.Option(
        None, help="A run directory to continue from its last complete checkpoint, with the config it was started "
                   "with (its config.yaml). Only steps, eval_every, checkpoint_every, checkpoint.keep_last and where "
                   "servers and ranks run may change (ada_core/run/resume.py); any other flag that differs is refused."),
    overwrite: bool = typer.Option(
        False, help="Start a new run in an --output-dir that holds one, moving the old run aside to "
                    "<dir>.replaced-<time> (never deleting it)."),
    config: Path | None = typer.Option(None, help="YAML file of config overrides."),
    set_: list[str] = typer.Option([], "--set", help="Override one field, e.g. --set sampler.M=4 (repeatable)."),
    seed: int | None = typer.Option(None, help="Seed (default 0)."),
    dataset: str | None = typer.Option(
        None, help="A generator name (arithmetic, chain_sum:2, ...), a local file/folder, or a hub id org/name[@revision]."),
    engine: str | None = typer.Option(None, help="Rollout engine: transformers, or vllm (a server from `make vllm-env`)."),
) -> None:
    """Train one policy with one preset; metrics go to <output-dir>/metrics.jsonl."""
    from ada_core.config import build_config, deep_merge, parse_set, read_config_file
    from ada_core.config.applies import run_facts
    from ada_core.data.prompts import pin_hub_ids
    from ada_core.engines.vllm_server import check_engine_config
    from ada_core.errors import InputError, RunFailure
    from ada_core.paths import runs_dir
    from ada_core.run.folder import check_run_dir
    from ada_core.run.resume import check_resume_target, resumed_config
    from ada_core.training import train as run_training

    _load_sampler_plugins()  # their presets and samplers are chosen like the platform's
    overrides: dict = {}
    for key, value in (("preset", preset), ("profile", profile), ("model", model), ("steps", steps), ("seed", seed)):
        if value is not None:
            overrides[key] = value
    if dataset is not None:
        overrides["data"] = {"dataset": dataset}
    if engine is not None:
        overrides["rollout"] = {"engine": engine}
    try:
        try:
            sets = parse_set(set_)
        except ValueError as err:  # a malformed --set is input too
            raise InputError(str(err)) from None
        check_set_against_flags(sets, {"preset": preset, "profile": profile, "model": model, "steps": steps,
                                       "seed": seed, "data.dataset": dataset, "rollout.engine": engine})
        overrides = deep_merge(overrides, sets)
        if resume is not None:
            # The run's own config; what the flags change is checked against it, before anything is read.
            out = output_dir or resume
            check_run_dir(out, resume=resume, overwrite=overwrite)  # a live run is refused here, naming its pid
            check_resume_target(resume)  # a missing folder, or nothing to resume: what works instead
            file_overrides = read_config_file(config) if config is not None else {}
            cfg = resumed_config(resume, deep_merge(file_overrides, overrides))
        else:
            cfg = build_config(preset or "grpo", profile or "tiny", config_file=config,
                               overrides={k: v for k, v in overrides.items() if k not in ("preset", "profile")},
                               facts=run_facts(curate=False))  # `ada train` never curates: data.curation_k is refused
            # Not created yet: a run that fails on its input leaves nothing behind under ADA_HOME.
            out = output_dir or runs_dir(create=False) / f"{cfg.preset}-seed{cfg.seed}"
            check_run_dir(out, overwrite=overwrite)  # before any model or data is built
        check_engine_config(cfg)
        cfg = pin_hub_ids(cfg)  # a hub id not to be had fails here, before any model or data is built
        last = run_training(cfg, out, resume=resume, overwrite=overwrite)
    except InputError as err:  # config, YAML, dataset, run-folder and resume errors alike
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(INPUT_ERROR_EXIT) from None
    except RunFailure as err:  # the run started and failed outside its input (a training rank died)
        typer.echo(f"error: {err.summary}", err=True)
        raise typer.Exit(RUN_FAILURE_EXIT) from None
    typer.echo(json.dumps({k: round(v, 4) for k, v in sorted(last.items())}, indent=1))
    typer.echo(f"run directory: {out}")


@app.command()
def evaluate(
    model: str = typer.Option(..., help="tiny, smollm2-135m, a local HF model folder, or a hub id org/name[@revision]."),
    suite: str | None = typer.Option(
        None, help="A named benchmark suite: paper (MATH500, Minerva Math, OlympiadBench, AIME-like by hub id). "
                   "Default: the held-out split of the profile's dataset only."),
    k: int | None = typer.Option(None, min=1, help="Samples per prompt (default: the suite's, 32 for paper; else the profile's)."),
    max_tokens: int | None = typer.Option(None, min=1, help="Generated-token limit (default: the suite's, 4096 for paper)."),
    temperature: float | None = typer.Option(None, min=1e-6, help="Sampling temperature (default: the suite's, 1.0)."),
    profile: str = typer.Option("tiny", help="Scale profile for lengths and the held-out split."),
    dataset: str | None = typer.Option(None, help="Held-out prompts from this dataset (default: the profile's)."),
    eval_size: int | None = typer.Option(None, min=1, help="Held-out prompts (default: the profile's)."),
    seed: int = typer.Option(0, help="Seed of the held-out split and of the samples."),
    output_dir: Path | None = typer.Option(None, help="Folder for generations (default: $ADA_HOME/runs/evaluate-<time>)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the metrics here."),
) -> None:
    """Score a model: avg@k and pass@k on a held-out split, and a named suite as the paper's accuracy table."""
    import time

    from ada_core.config import build_config
    from ada_core.config.applies import run_facts
    from ada_core.data.prompts import pin_hub_ids
    from ada_core.data.suites import accuracy_table, get_suite, suite_overrides
    from ada_core.errors import InputError
    from ada_core.paths import runs_dir
    from ada_core.training import evaluate as evaluate_state
    from ada_core.training import setup

    data = {k_: v for k_, v in (("dataset", dataset), ("eval_size", eval_size)) if v is not None}
    overrides: dict = {"model": model, "sft_steps": 0, "seed": seed, "steps": 1, "data": data,
                       "ledger": {"enabled": False}}
    if k is not None:
        overrides["eval_k"] = k
    if max_tokens is not None:
        overrides["eval_max_tokens"] = max_tokens
    if temperature is not None:
        overrides["eval_temperature"] = temperature
    try:
        if suite is not None:
            overrides.update(suite_overrides(suite, k, max_tokens, temperature))
        cfg = pin_hub_ids(build_config("grpo", profile, overrides=overrides, facts=run_facts(curate=False)))
        out = output_dir or runs_dir() / f"evaluate-{time.strftime('%Y%m%d-%H%M%S')}"
        state = setup(cfg, out)
    except InputError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(INPUT_ERROR_EXIT) from None
    try:
        metrics = evaluate_state(state)
    finally:
        state.close()
    typer.echo(json.dumps({key: round(v, 4) for key, v in sorted(metrics.items())}, indent=1))
    if suite is not None:
        typer.echo(accuracy_table(get_suite(suite), metrics, state.config.model, cfg.eval_k,
                                  cfg.eval_max_tokens or cfg.rollout.max_tokens, cfg.eval_temperature))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(metrics, indent=2) + "\n")


@app.command("vllm-serve")
def vllm_serve(
    model: str = typer.Option("tiny", help="tiny, tiny-l4, smollm2-135m, a local HF model folder, or a hub id "
                                            "(the run's model: the run loads its own weights into it first)."),
    host: str = typer.Option("127.0.0.1", help="The address to bind: this machine's address on the network the "
                                              "trainer reaches it by (infra/GPU.md, 3c)."),
    port: int = typer.Option(8000, min=1, max=65535, help="The port to bind."),
    dtype: str = typer.Option("float32", help="--dtype of the server: float32 (the fp32 trainer's), bfloat16, float16."),
    max_model_len: int | None = typer.Option(None, min=1, help="Context length (default: the model's own)."),
    kv_cache_gib: int = typer.Option(1, min=1, help="CPU only: KV-cache size in GiB."),
    startup_timeout_s: float = typer.Option(300.0, min=1.0, help="Seconds to wait for /health."),
) -> None:
    """Serve rollouts for a run on another machine: a vLLM server (from `make vllm-env`) as a run launches one,
    requiring the key in $ADA_VLLM_API_KEY on every request; attach with rollout.vllm.base_url(s). Runs until
    stopped (Ctrl-C or SIGTERM), and the server with it."""
    import os
    import signal
    import time

    from ada_core.engines.vllm_server import API_KEY_ENV, VLLMServer, VLLMServerError, vllm_python
    from ada_core.models.build import resolve_model
    from ada_core.paths import ada_home

    def refuse(message: str) -> None:
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(INPUT_ERROR_EXIT)

    key = os.environ.get(API_KEY_ENV, "")
    if not key:
        refuse(f"${API_KEY_ENV} is not set: the server requires it on every request, and the trainer sends it "
               f"from its own ${API_KEY_ENV} (set the same value on both machines)")
    if dtype not in ("float32", "bfloat16", "float16"):
        refuse(f"--dtype {dtype!r}: choose float32, bfloat16 or float16")
    try:
        python = vllm_python()
        model_dir = resolve_model(model)
    except (FileNotFoundError, ValueError, VLLMServerError) as err:
        refuse(str(err))
    log_path = ada_home() / "vllm" / f"serve-{host}-{port}.log"
    server = VLLMServer(model_dir, host=host, port=port, dtype=dtype, max_model_len=max_model_len,
                        cpu_kvcache_gib=kv_cache_gib, startup_timeout_s=startup_timeout_s, python=python, api_key=key,
                        log_path=log_path)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        server.start()
        typer.echo(f"vLLM serving {model_dir} at {server.base_url} (log: {log_path}); attach a run with "
                   f"--set rollout.vllm.base_url={server.base_url} and the same ${API_KEY_ENV}")
        while not stopping and server.exit_code() is None:
            time.sleep(0.5)
        if server.exit_code() is not None:
            typer.echo(f"error: the vLLM server exited with code {server.exit_code()}; log: {log_path}", err=True)
            raise typer.Exit(RUN_FAILURE_EXIT)
    except VLLMServerError as err:
        typer.echo(f"error: {str(err).splitlines()[0]}; log: {log_path}", err=True)
        raise typer.Exit(RUN_FAILURE_EXIT) from None
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@app.command()
def ledger(
    run_dir: Path = typer.Argument(..., help="A run folder (it holds ledger.json)."),
    csv: bool = typer.Option(False, "--csv", help="CSV instead of JSON."),
    url: str | None = typer.Option(None, help="Database URL (default: $ADA_LEDGER_URL, else the one in ledger.json)."),
) -> None:
    """Per-prompt totals of a run's prompt ledger: draws, samples, positives, pass rate, groups trained."""
    import csv as csv_module
    import sys

    from ada_core.run.ledger import prompt_totals, read_rows

    try:
        totals = prompt_totals(read_rows(run_dir, url))
    except (FileNotFoundError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="RUN_DIR") from None
    if csv:
        fields = ["prompt_id", "draws", "samples", "positives", "pass_rate", "trained", "skipped", "resolved",
                  "first_step", "last_step"]
        writer = csv_module.DictWriter(sys.stdout, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(totals)
    else:
        typer.echo(json.dumps(totals, indent=1))


if __name__ == "__main__":
    app()
