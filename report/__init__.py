"""The offline comparison report: plots, a final-metrics table and paired differences, from run folders alone.

No Prefect and no MLflow: it reads run folders through `ada_core.run.files` and
`ada_core.run.checkpoints`, so it works on any machine that has the folders.

- `curves`: a run folder as `RunCurves` (one point per step), the budget axes.
- `tables`: the final-metrics table (mean ± std over seeds), as markdown and as plain rows.
- `bands`: each variant's mean over seeds with a ±1 std band (interactive HTML and PNG).
- `plots`: accuracy and reward against each budget axis, per-step curves, the step-time split.
- `configs`: every config field that differs between the variants, algorithm fields and `other`.
- `paired`: paired differences from a reference variant at equal budget, with 95% intervals.
- `paper_tables`: the paper's Tables A (accuracy) and B (step time), Table C (equal budget), Table D.
- `pools`: which runs of a pool the paper tables read, at which step (runs of unequal length are not mixed).
- `convergence`: Table D, the steps and samples to reach GRPO n = 4's final accuracy, and the speed-up.
- `prompt_plot`: the prompt-ledger plot (pass rate per prompt over training).
- `writer`: `write_report` (every file and report.md) and the command line.

    python -m report RUN_DIR... --out OUT_DIR [--reference grpo]
"""

from report.bands import BAND_AXES, Band, plot_bands_html, plot_bands_png, variant_bands
from report.configs import config_differences, differences_markdown
from report.curves import (
    CUMULATIVE,
    FLOPS_CUM,
    PAIRED_AXES,
    STEP_TIME_CUM,
    TIME_SPLIT,
    X_AXES,
    Y_AXES,
    RunCurves,
    count_params,
    load_run,
    merge_rows,
)
from report.paired import mean_ci, paired_differences, paired_table, reference_for, regime_of, value_at
from report.convergence import crossing, table_d
from report.paper_tables import paper_tables_markdown, table_a, table_b, table_c
from report.plots import plot_against, plot_per_step, plot_time_split
from report.prompt_plot import pass_rate_matrix, plot_prompt_ledger
from report.tables import final_metrics, mean_std, summary_rows, summary_table
from report.writer import Report, main, write_report

__all__ = [
    "BAND_AXES", "Band", "CUMULATIVE", "FLOPS_CUM", "PAIRED_AXES", "Report", "RunCurves", "STEP_TIME_CUM",
    "TIME_SPLIT", "X_AXES", "Y_AXES", "config_differences", "count_params", "crossing", "differences_markdown",
    "final_metrics", "load_run", "main", "mean_ci", "mean_std", "merge_rows", "paired_differences", "paired_table",
    "paper_tables_markdown", "pass_rate_matrix", "plot_against", "plot_bands_html", "plot_bands_png",
    "plot_per_step", "plot_prompt_ledger", "plot_time_split", "reference_for", "regime_of", "summary_rows",
    "summary_table", "table_a", "table_b", "table_c", "table_d", "value_at", "variant_bands", "write_report",
]
