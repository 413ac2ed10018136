"""The `ada` command line. One typer app; each command is a thin call into ada_core."""

from __future__ import annotations

import json
from pathlib import Path

import typer

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
    json_path: Path | None = typer.Option(None, "--json", help="Write the per-method summary here."),
    png_path: Path | None = typer.Option(None, "--png", help="Write the plot here."),
) -> None:
    """Compare the samplers on a Bernoulli engine with known pass rates (no model, seconds)."""
    from ada_core.simulate import DifficultyMix, format_table, plot, run_simulation

    if frac_zero + frac_one > 1.0:
        raise typer.BadParameter(f"--frac-zero + --frac-one = {frac_zero + frac_one} must be <= 1")
    mix = DifficultyMix(frac_zero=frac_zero, frac_one=frac_one, beta_a=beta_a, beta_b=beta_b)
    results = run_simulation(num_prompts=prompts, steps=steps, seed=seed, mix=mix)
    typer.echo(
        f"{prompts} prompts x {steps} steps, seed {seed}; pass rates: {frac_zero:.0%} p=0, {frac_one:.0%} p=1, "
        f"rest Beta({beta_a:g}, {beta_b:g}); expected zero-variance groups at n=4: {mix.zero_variance_frac(4):.1%}"
    )
    typer.echo(format_table(results))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "config": {"prompts": prompts, "steps": steps, "seed": seed, "difficulty": mix.__dict__},
            "methods": results,
        }
        json_path.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n")
        typer.echo(f"wrote {json_path}")
    if png_path is not None:
        png_path.parent.mkdir(parents=True, exist_ok=True)
        plot(results, str(png_path))
        typer.echo(f"wrote {png_path}")


if __name__ == "__main__":
    app()
