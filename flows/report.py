"""The comparison report: plots and a final-metrics table, read from run directories alone.

It reads each run's `metrics.jsonl` (`ada_core.training.read_metrics`), so it works offline and on
runs the CLI made:

    python -m flows.report .ada/runs/compare-x/grpo-s0 .ada/runs/compare-x/ada-balance-s0 --out report/

Held-out accuracy and reward are plotted against five x axes, because per-step curves flatter a
sampler that spends more per step (DESIGN.md section 2): step, cumulative generated samples,
trained tokens, wall time and estimated compute. Equal-compute comparisons are where
matched-budget claims are judged.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on servers and workers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

from ada_core import metrics as K  # noqa: E402
from ada_core.sampling.budget import compute_flops  # noqa: E402
from ada_core.run.checkpoints import latest_checkpoint
from ada_core.run.files import read_metrics  # noqa: E402
from flows.paired import paired_differences, paired_table  # noqa: E402
from flows.prompt_plot import plot_prompt_ledger  # noqa: E402

FLOPS_CUM = "compute/flops_cum"  # derived here from the budget counters; not logged by the trainer
STEP_TIME_CUM = "compute/step_time_cum"  # derived here: cumulative generate + reward + update + sync seconds
RUN_INFO = "run_info.json"  # written by the flows next to metrics.jsonl: label, seed, num_params

X_AXES: dict[str, tuple[str, str]] = {
    "step": ("step", "training step"),
    "generated_samples": (K.BUDGET_GENERATED_SAMPLES_CUM, "cumulative generated samples"),
    "trained_tokens": (K.BUDGET_TRAINED_TOKENS_CUM, "cumulative trained tokens"),
    "wall_time": (K.TIME_ELAPSED_S, "wall time (s)"),
    "compute": (FLOPS_CUM, "estimated compute (FLOPs)"),
    "step_time": (STEP_TIME_CUM, "measured compute: cumulative generate + reward + update + sync (s)"),
}
# The budget axes of the paired differences (flows/paired.py).
PAIRED_AXES = {
    "generated samples": K.BUDGET_GENERATED_SAMPLES_CUM,
    "trained tokens": K.BUDGET_TRAINED_TOKENS_CUM,
    "FLOPs": FLOPS_CUM,
    "measured step time": STEP_TIME_CUM,
    "step": "step",
}
Y_AXES: dict[str, str] = {K.EVAL_AVG_AT_K: "held-out accuracy (avg@k)", K.REWARD_MEAN: "reward (round-1 mean)"}
TIME_SPLIT = [K.TIME_GENERATE_S, K.TIME_REWARD_S, K.TIME_UPDATE_S, K.TIME_SYNC_S]
CUMULATIVE = [
    K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_GENERATED_TOKENS_CUM, K.BUDGET_TRAINED_SAMPLES_CUM,
    K.BUDGET_TRAINED_TOKENS_CUM, K.BUDGET_LOGPROB_TOKENS_CUM, K.TIME_ELAPSED_S,
]


@dataclass
class RunCurves:
    """One run's metrics on a step timeline: `points[i]` describes the run after step `points[i]['step']`."""

    label: str
    seed: int
    run_dir: Path
    num_params: int | None
    points: list[dict[str, float]]

    def series(self, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
        pts = [p for p in self.points if x_key in p and y_key in p]
        return np.array([p[x_key] for p in pts], dtype=float), np.array([p[y_key] for p in pts], dtype=float)

    def step_values(self, key: str) -> np.ndarray:
        """`key` over training steps only (the step-0 evaluation point excluded)."""
        return np.array([p[key] for p in self.points if p["step"] > 0 and key in p], dtype=float)

    def last(self, key: str) -> float:
        values = [p[key] for p in self.points if key in p]
        return float(values[-1]) if values else math.nan


def merge_rows(rows: list[dict[str, float]], num_params: int | None = None) -> list[dict[str, float]]:
    """Merge metrics.jsonl rows into one point per step, cumulative counters starting at 0 at step 0.

    metrics.jsonl holds a step row (the step's metrics) and, on eval steps, an eval row with the
    same step number. Example: rows `{step 0, eval}`, `{step 1, ...}`, `{step 1, eval}` ->
    points `[{step 0, eval, *_cum 0}, {step 1, ..., eval}]`. With `num_params`, each point also
    gets `compute/flops_cum` from `ada_core.sampling.budget.compute_flops`.
    """
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), {}).update(row)
    points = []
    step_time = 0.0
    for step in sorted(by_step):
        point = dict(by_step[step])
        point["step"] = float(step)
        step_time += sum(point.get(key, 0.0) for key in TIME_SPLIT) if step > 0 else 0.0
        point[STEP_TIME_CUM] = step_time
        if step == 0:
            for key in CUMULATIVE:
                point.setdefault(key, 0.0)
        if num_params is not None and K.BUDGET_GENERATED_TOKENS_CUM in point:
            point[FLOPS_CUM] = compute_flops(
                num_params,
                point[K.BUDGET_GENERATED_TOKENS_CUM],
                point.get(K.BUDGET_TRAINED_TOKENS_CUM, 0.0),
                point.get(K.BUDGET_LOGPROB_TOKENS_CUM, 0.0),
            )
        points.append(point)
    return points


def count_params(run_dir: Path) -> int | None:
    """Parameter count: from run_info.json, else from the newest checkpoint's safetensors headers."""
    info = run_dir / RUN_INFO
    if info.is_file():
        value = json.loads(info.read_text()).get("num_params")
        if value:
            return int(value)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return None
    from safetensors import safe_open

    total = 0
    for shard in (checkpoint / "hf").glob("*.safetensors"):
        with safe_open(str(shard), framework="numpy") as fh:
            for name in fh.keys():
                total += int(np.prod(fh.get_slice(name).get_shape()))
    return total or None


def load_run(run_dir: str | Path, label: str | None = None, seed: int | None = None) -> RunCurves:
    """A run directory's curves; label and seed default to run_info.json, then config.yaml."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl rows; is this a run directory?")
    info = json.loads((run_dir / RUN_INFO).read_text()) if (run_dir / RUN_INFO).is_file() else {}
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    label = label or info.get("label") or config.get("preset") or run_dir.name
    seed = seed if seed is not None else int(info.get("seed", config.get("seed", 0)))
    num_params = count_params(run_dir)
    return RunCurves(label, seed, run_dir, num_params, merge_rows(rows, num_params))


# ---------------------------------------------------------------------------------------------
# Tables


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for a single seed), NaNs ignored."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return math.nan, math.nan
    return float(np.mean(clean)), float(np.std(clean, ddof=1)) if len(clean) > 1 else 0.0


def final_metrics(run: RunCurves) -> dict[str, float]:
    """The numbers a comparison table reports for one run."""
    reward = run.step_values(K.REWARD_MEAN)
    return {  # readable column names; docs/METRICS.md has the keys behind them
        "held-out accuracy (avg@k)": run.last(K.EVAL_AVG_AT_K),
        "held-out pass@k": run.last(K.EVAL_PASS_AT_K),
        "reward, last 5 steps": float(reward[-5:].mean()) if reward.size else math.nan,
        "effective ratio": _mean(run.step_values(K.SAMPLER_EFFECTIVE_RATIO)),
        "samples per step": _mean(run.step_values(K.BUDGET_GENERATED_SAMPLES)),
        "generated samples": run.last(K.BUDGET_GENERATED_SAMPLES_CUM),
        "trained tokens": run.last(K.BUDGET_TRAINED_TOKENS_CUM),
        "FLOPs": run.last(FLOPS_CUM),
        "wall time (s)": run.last(K.TIME_ELAPSED_S),
    }


def summary_table(runs: list[RunCurves]) -> str:
    """Markdown: one row per label, each cell `mean ± std` over its seeds.

    | variant | seeds | held-out accuracy (avg@k) | ...
    | grpo    | 2     | 0.412 ± 0.013             | ...
    """
    labels = list(dict.fromkeys(r.label for r in runs))
    per_run = {id(r): final_metrics(r) for r in runs}
    columns = list(next(iter(per_run.values())).keys()) if per_run else []
    lines = ["| variant | seeds | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 2)]
    for label in labels:
        group = [r for r in runs if r.label == label]
        cells = []
        for col in columns:
            mean, std = mean_std([per_run[id(r)][col] for r in group])
            cells.append(_fmt(mean, std))
        seeds = ",".join(str(r.seed) for r in group)
        lines.append(f"| {label} | {len(group)} ({seeds}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "n/a"
    if abs(mean) >= 1e4:
        return f"{mean:.3g} ± {std:.2g}"
    return f"{mean:.3f} ± {std:.3f}"


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


# ---------------------------------------------------------------------------------------------
# Plots


def _colors(runs: list[RunCurves]) -> dict[str, Any]:
    labels = list(dict.fromkeys(r.label for r in runs))
    cmap = plt.get_cmap("tab10")
    return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _plot_lines(ax, runs: list[RunCurves], x_key: str, y_key: str, colors: dict[str, Any], marker: str | None) -> None:
    labelled: set[str] = set()
    alpha = 0.9 if len({r.seed for r in runs}) == 1 else 0.6
    for run in runs:
        x, y = run.series(x_key, y_key)
        if x.size == 0:
            continue
        ax.plot(x, y, color=colors[run.label], marker=marker, markersize=3, alpha=alpha, linewidth=1.4,
                label=None if run.label in labelled else run.label)
        labelled.add(run.label)


def plot_against(runs: list[RunCurves], axis: str, out: Path) -> Path:
    """Accuracy (left) and reward (right) against one x axis, one line per run, coloured by variant."""
    x_key, x_label = X_AXES[axis]
    colors = _colors(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (y_key, y_label) in zip(axes, Y_AXES.items()):
        _plot_lines(ax, runs, x_key, y_key, colors, marker="o" if y_key == K.EVAL_AVG_AT_K else None)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        if axis in ("compute", "trained_tokens", "generated_samples"):
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"accuracy and reward vs {x_label}")
    fig.tight_layout()
    path = out / f"accuracy_reward_vs_{axis}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_per_step(runs: list[RunCurves], key: str, y_label: str, out: Path, name: str) -> Path:
    colors = _colors(runs)
    fig, ax = plt.subplots(figsize=(6, 4))
    _plot_lines(ax, runs, "step", key, colors, marker=None)
    ax.set_xlabel("training step")
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_time_split(runs: list[RunCurves], out: Path) -> Path:
    """Stacked bars: mean seconds per step in generate / reward / update / sync, per variant."""
    labels = list(dict.fromkeys(r.label for r in runs))
    fig, ax = plt.subplots(figsize=(1.6 * len(labels) + 3, 4))
    bottom = np.zeros(len(labels))
    for key in TIME_SPLIT:
        heights = np.array([
            _mean(np.concatenate([r.step_values(key) for r in runs if r.label == label])) for label in labels
        ])
        heights = np.nan_to_num(heights)
        ax.bar(labels, heights, bottom=bottom, label=key.removeprefix("time/"))
        bottom += heights
    ax.set_ylabel("seconds per step (mean over steps and seeds)")
    ax.legend(fontsize=8)
    ax.set_title("step-time split")
    fig.tight_layout()
    path = out / "time_split.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# The report


@dataclass
class Report:
    markdown: str
    files: list[Path]
    directory: Path
    summary: str = ""
    """The markdown before the plots (title, note, table), for callers that place the plots themselves."""

    def plots_markdown(self, url_of: Callable[[str], str | None] = lambda name: name) -> str:
        """Each PNG as a markdown image at `url_of(file name)` (default: the name, relative to report.md)."""
        lines = []
        for f in self.files:
            if f.suffix == ".png":
                url = url_of(f.name)
                lines.append(f"![{f.stem}]({url})" if url else f"`{f.name}`")
        return "\n\n".join(lines)


def write_report(runs: list[RunCurves], out_dir: str | Path, title: str = "Comparison report",
                 reference: str | None = None) -> Report:
    """Write every PNG and `report.md` into `out_dir`; return them and the markdown.

    With `reference` (a variant label), the report adds each other variant's paired difference from it
    (flows/paired.py) and writes them to `paired.json`."""
    if not runs:
        raise ValueError("write_report needs at least one run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [plot_against(runs, axis, out) for axis in X_AXES]
    files.append(plot_per_step(runs, K.SAMPLER_EFFECTIVE_RATIO, "effective ratio", out, "effective_ratio"))
    files.append(plot_per_step(runs, K.BUDGET_GENERATED_SAMPLES, "generated samples per step", out, "samples_per_step"))
    files.append(plot_time_split(runs, out))
    ledger_plot = plot_prompt_ledger(runs, out)
    if ledger_plot is not None:
        files.append(ledger_plot)
    paired_md: list[str] = []
    if reference is not None:
        pairs = paired_differences(runs, reference, PAIRED_AXES)
        (out / "paired.json").write_text(json.dumps(pairs, indent=1) + "\n")
        files.append(out / "paired.json")
        paired_md = [
            f"Paired differences from `{reference}` (same seed and regime): held-out avg@k at the budget both "
            "runs reached, read off each eval curve by linear interpolation; mean over seeds with a 95% "
            "t-interval (flows/paired.py).",
            "",
            paired_table(pairs),
            "",
        ]
    params = sorted({r.num_params for r in runs if r.num_params})
    summary = "\n".join([
        f"# {title}",
        "",
        "Final metrics, mean ± std over seeds. Held-out numbers are from the last evaluation; FLOPs = 2·params per "
        "generated token + 6·params per trained token + 2·params per log-prob token"
        + (f" (params = {', '.join(f'{p:,}' for p in params)})." if params else "."),
        "",
        summary_table(runs),
        *(["", *paired_md] if paired_md else []),
    ])
    report = Report(markdown="", files=files, directory=out, summary=summary)
    report.markdown = f"{summary}\n\n## Plots\n\n{report.plots_markdown()}\n"
    (out / "report.md").write_text(report.markdown)
    files.append(out / "report.md")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Comparison report from run directories (offline).")
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("report"))
    parser.add_argument("--reference", default=None, help="variant label to pair every other against, e.g. grpo")
    args = parser.parse_args(argv)
    report = write_report([load_run(d) for d in args.run_dirs], args.out, reference=args.reference)
    print(report.markdown)
    print(f"wrote {len(report.files)} files to {report.directory}")


if __name__ == "__main__":
    main()
