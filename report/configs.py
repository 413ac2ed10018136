"""Where the compared runs' configs differ: every field whose value is not the same for every variant.

A comparison is meant to compare algorithms, so the presets differ only in `ALGORITHM_FIELDS`
(ada_core/config/presets.py). Anything else that differs between the variants (the matched GRPO
control's `prompts_per_step`, an override given to one child, a run started from another model) is a
second difference the results also measure; the report lists every field from each run's
config.yaml and marks those outside the algorithm `other`, so none goes unseen.

A variant's value is the set of its runs' values: `seed` differs between a variant's runs but is the
same set for every variant of a compare, so it is not listed; a field whose runs disagree within
a variant shows each value.
"""

from __future__ import annotations

import json
from typing import Any

from ada_core.config import flatten_dotted
from ada_core.config.presets import is_algorithm_field
from report.curves import RunCurves


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def config_differences(runs: list[RunCurves]) -> list[dict[str, Any]]:
    """One row per config field whose values differ between the variants, in field order:
    `{"field", "kind": "algorithm" | "other", "values": {variant: "v" or "v1 / v2"}}`.
    Runs without a config.yaml are left out (`runs_without_config` names them)."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.config:
            by_label.setdefault(run.label, []).append(flatten_dotted(run.config))
    if len(by_label) < 2:
        return []
    fields = list(dict.fromkeys(k for flats in by_label.values() for flat in flats for k in flat))
    rows = []
    for name in fields:
        values = {label: sorted({_show(flat.get(name, "(absent)")) for flat in flats})
                  for label, flats in by_label.items()}
        if len({tuple(v) for v in values.values()}) > 1:
            rows.append({"field": name, "kind": "algorithm" if is_algorithm_field(name) else "other",
                         "values": {label: " / ".join(v) for label, v in values.items()}})
    return rows


def runs_without_config(runs: list[RunCurves]) -> list[str]:
    return [f"{run.label} seed {run.seed}" for run in runs if not run.config]


def differences_markdown(runs: list[RunCurves]) -> str:
    """The report's section: a table of `config_differences` (algorithm fields first), or a line
    saying the variants differ in nothing."""
    rows = config_differences(runs)
    labels = list(dict.fromkeys(r.label for r in runs if r.config))
    missing = runs_without_config(runs)
    lines = ["## Config differences between variants", ""]
    if len(labels) < 2:
        lines.append("Fewer than two variants with a config.yaml: nothing to compare.")
    elif not rows:
        lines.append("The variants' configs are identical apart from their seeds.")
    else:
        other = [r for r in rows if r["kind"] == "other"]
        lines.append(
            f"Every config field whose value differs between the variants (from each run's config.yaml): "
            f"{len(rows) - len(other)} algorithm field(s) and **{len(other)} other**; an `other` field is a "
            "difference the results measure too. Algorithm fields are `ALGORITHM_FIELDS` "
            "(ada_core/config/presets.py).")
        lines += ["", "| field | kind | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 2)]
        for r in sorted(rows, key=lambda r: r["kind"] != "algorithm"):
            kind = r["kind"] if r["kind"] == "algorithm" else "**other**"
            cells = " | ".join(f"`{r['values'].get(label, '')}`" for label in labels)
            lines.append(f"| `{r['field']}` | {kind} | {cells} |")
    if missing:
        lines += ["", f"Not compared (no config.yaml): {', '.join(missing)}."]
    return "\n".join(lines)
