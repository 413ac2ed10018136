"""The `ada` command line. One typer app; each command is a thin call into ada_core."""

from __future__ import annotations

import json
from pathlib import Path

import typer

# Every bad input (config value, YAML file, dataset file or row) exits with this code and one clean
# line on stderr, the same code typer gives a bad option.
INPUT_ERROR_EXIT = 2

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
    from ada_core.sampling.simulate import DifficultyMix, format_table, plot, run_simulation

    if frac_zero + frac_one > 1.0:
        raise typer.BadParameter(f"--frac-zero + --frac-one = {frac_zero + frac_one} must be <= 1")
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


@app.command()
def train(
    preset: str = typer.Option("grpo", help="Algorithm preset: grpo, grpo-n8, grpo-n16, dapo, ada-pos, ada-balance, "
                                               "ada-est, ada-posterior, ada-budget (docs/ALGORITHM.md)."),
    profile: str = typer.Option("tiny", help="Scale profile: tiny, smollm2-135m, paper."),
    model: str | None = typer.Option(None, help="tiny, smollm2-135m, or a local HF model folder (default: the profile's)."),
    steps: int | None = typer.Option(None, min=1, help="Training steps (default: the profile's)."),
    output_dir: Path | None = typer.Option(
        None, help="Run directory (default: the --resume folder, else $ADA_HOME/runs/<preset>-seed<seed>). "
                   "A folder that already holds a run is refused unless it is the one resumed or --overwrite is given."),
    resume: Path | None = typer.Option(None, help="A run directory to continue from its last complete checkpoint."),
    overwrite: bool = typer.Option(
        False, help="Start a new run in an --output-dir that holds one, moving the old run aside to "
                    "<dir>.replaced-<time> (never deleting it)."),
    config: Path | None = typer.Option(None, help="YAML file of config overrides."),
    set_: list[str] = typer.Option([], "--set", help="Override one field, e.g. --set sampler.M=4 (repeatable)."),
    seed: int | None = typer.Option(None, help="Seed (default 0)."),
    dataset: str | None = typer.Option(None, help="A generator name (arithmetic, chain_sum:2, ...) or a local file/folder."),
    engine: str | None = typer.Option(None, help="Rollout engine: transformers, or vllm (a server from `make vllm-env`)."),
) -> None:
    """Train one policy with one preset; metrics go to <output-dir>/metrics.jsonl."""
    from ada_core.config import build_config, deep_merge, parse_set
    from ada_core.errors import InputError
    from ada_core.engines.vllm_server import check_engine_config
    from ada_core.paths import runs_dir
    from ada_core.run.folder import check_run_dir
    from ada_core.training import train as run_training

    overrides: dict = {}
    for key, value in (("model", model), ("steps", steps), ("seed", seed)):
        if value is not None:
            overrides[key] = value
    if dataset is not None:
        overrides["data"] = {"dataset": dataset}
    if engine is not None:
        overrides["rollout"] = {"engine": engine}
    try:
        try:
            overrides = deep_merge(overrides, parse_set(set_))
        except ValueError as err:  # a malformed --set is input too
            raise InputError(str(err)) from None
        cfg = build_config(preset, profile, config_file=config, overrides=overrides)
        check_engine_config(cfg)
        # Not created yet: a run that fails on its input leaves nothing behind under ADA_HOME.
        out = output_dir or resume or runs_dir(create=False) / f"{preset}-seed{cfg.seed}"
        check_run_dir(out, resume=resume, overwrite=overwrite)  # before any model or data is built
        last = run_training(cfg, out, resume=resume, overwrite=overwrite)
    except InputError as err:  # config, YAML, dataset and run-folder errors alike
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(INPUT_ERROR_EXIT) from None
    typer.echo(json.dumps({k: round(v, 4) for k, v in sorted(last.items())}, indent=1))
    typer.echo(f"run directory: {out}")


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
