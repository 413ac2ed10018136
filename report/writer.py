"""The comparison report: plots and a final-metrics table, read from run directories alone.

It reads each run's `metrics.jsonl` (`ada_core.run.files.read_metrics`), so it works offline and on
runs the CLI made:

    python -m report .ada/runs/compare-x/grpo-s0 .ada/runs/compare-x/ada-balance-s0 --out report/

Held-out accuracy and reward are plotted against five x axes, because per-step curves flatter a
sampler that spends more per step (DESIGN.md section 2): step, cumulative generated samples,
trained tokens, wall time and estimated compute. Equal-compute comparisons are where
matched-budget claims are judged.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ada_core import metrics as K
from report.bands import plot_bands_html, plot_bands_png
from report.configs import config_differences, differences_markdown
from report.curves import PAIRED_AXES, X_AXES, RunCurves, load_run
from report.paired import paired_differences, paired_table
from report.paper_tables import table_c
from report.plots import plot_against, plot_per_step, plot_time_split
from report.prompt_plot import plot_prompt_ledger
from report.tables import summary_table


@dataclass
class Report:
    markdown: str
    files: list[Path]
    directory: Path
    summary: str = ""
    """The markdown before the plots (title, note, table), for callers that place the plots themselves."""

    def plots_markdown(self, url_of: Callable[[str], str | None] = lambda name: name,
                       page_of: Callable[[str], str | None] | None = None) -> str:
        """Each PNG as a markdown image at `url_of(file name)` (default: the name, relative to report.md) and
        each HTML page as a link at `page_of(file name)` (default `url_of`): where a file's raw URL downloads
        it, `page_of` gives the page that shows it."""
        page_of = page_of or url_of
        lines = []
        for f in self.files:
            if f.suffix == ".png":
                url = url_of(f.name)
                lines.append(f"![{f.stem}]({url})" if url else f"`{f.name}`")
            elif f.suffix == ".html":
                url = page_of(f.name)
                lines.append(f"Interactive (zoom, hover, hide variants): [{f.name}]({url})" if url else f"`{f.name}`")
        return "\n\n".join(lines)


def write_report(runs: list[RunCurves], out_dir: str | Path, title: str = "Comparison report",
                 reference: str | None = None) -> Report:
    """Write every PNG and `report.md` into `out_dir`; return them and the markdown.

    With `reference` (a variant label), the report adds each other variant's paired difference from it
    (report/paired.py) and writes them to `paired.json`. Every config field that differs between the
    variants is listed (report/configs.py) and written to `config_differences.json`."""
    if not runs:
        raise ValueError("write_report needs at least one run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [plot_bands_png(runs, out), plot_bands_html(runs, out)]
    files += [plot_against(runs, axis, out) for axis in X_AXES]
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
            f"Paired differences from `{reference}` (same seed and regime): held-out avg@k with every seed of a "
            "row read at one budget (`read at`: the smallest final budget any of the row's runs reached), off "
            "each eval curve by linear interpolation; `diff`: mean over seeds with a 95% t-interval (report/paired.py). "
            "A seed with no evaluation is excluded from the mean and the count, and named in the seeds column.",
            "",
            paired_table(pairs),
            "",
            f"## Table C: avg@k minus `{reference}`'s at equal generated samples and at equal trained tokens",
            "",
            "Paired by seed, 95% t-interval; bold where the interval excludes 0 (report/paper_tables.py).",
            "",
            table_c({"this group": runs}, reference, pool_column=False),
            "",
        ]
    differences = config_differences(runs)
    (out / "config_differences.json").write_text(json.dumps(differences, indent=1) + "\n")
    files.append(out / "config_differences.json")
    params = sorted({r.num_params for r in runs if r.num_params})
    summary = "\n".join([
        f"# {title}",
        "",
        "Final metrics, mean ± std over seeds (one seed has no std: n/a). Held-out numbers are from the last evaluation; FLOPs = 2·params per "
        "generated token + 6·params per trained token + 2·params per log-prob token"
        + (f" (params = {', '.join(f'{p:,}' for p in params)})." if params else "."),
        "",
        summary_table(runs),
        *(["", *paired_md] if paired_md else []),
        "",
        differences_markdown(runs),
    ])
    report = Report(markdown="", files=files, directory=out, summary=summary)
    report.markdown = f"{summary}\n\n## Plots\n\n{report.plots_markdown()}\n"
    (out / "report.md").write_text(report.markdown)
    files.append(out / "report.md")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m report", description="Comparison report from run directories (offline).")
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("out/report"),
                        help="folder for report.md and the plots (default out/report: never the report package itself)")
    parser.add_argument("--reference", default=None, help="variant label to pair every other against, e.g. grpo")
    args = parser.parse_args(argv)
    report = write_report([load_run(d) for d in args.run_dirs], args.out, reference=args.reference)
    print(report.markdown)
    print(f"wrote {len(report.files)} files to {report.directory}")


if __name__ == "__main__":
    main()
