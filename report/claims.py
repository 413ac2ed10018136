"""The results book's comparison sentences and the paper's claims, produced from saved runs.

A sentence that orders two methods says "A above B" only where the paired 95% interval of A - B excludes 0,
"A below B" where it excludes 0 the other way, and names a tie a tie; each carries its number, its interval,
the seeds and the budget (step or samples) it is read at. docs/benchmarks/testbed.md holds the blocks this
module writes between `<!-- claims:begin ... -->` and `<!-- claims:end -->` markers, and
tests/fast/test_results_book.py writes them again from the committed saved runs and compares, so a sentence
the numbers do not support cannot stand in the book.

    python -m report.claims docs/benchmarks/runs/FILE.jsonl ...     # the blocks, from the files given
    python -m report.claims --write docs/benchmarks/testbed.md       # every block of a page, written again

What is compared, and where:
- **Per step** (the paper's reading): A - B at the pool's read step (report/pools.py), paired by seed.
- **At equal samples and updates** (what no paper reports): each adaptive method against its budget-matched
  GRPO controls (report/paper_tables.py, Table C), at the read step, where both made the same updates and
  spent about the same samples.
- **Across pools** ("larger gains on the hard pool"): the difference of two pools' paired differences, seeds
  independent between pools: Welch's t-interval.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from ada_core import metrics as K
from report.paired import mean_ci, value_at
from report.paper_tables import matched_rows
from report.pools import PoolRuns, read_pools

PAPER_NAMES = {"grpo": "GRPO n = 4", "grpo-n8": "GRPO n = 8", "grpo-n16": "GRPO n = 16", "dapo": "DAPO",
               "ada-pos": "Seq-pos", "ada-balance": "Seq-balance", "ada-est": "Est",
               # the research samplers (ada_core/sampling/research.py): ordered where their runs are read
               "knapsack": "Knapsack", "pilot": "Pilot", "greso": "GRESO", "ada-v3w": "v3-weighted Seq-balance"}


def name(method: str) -> str:
    return PAPER_NAMES.get(method, method)


def paired_at_step(pool: PoolRuns, a: str, b: str, step: float | None = None) -> dict | None:
    """A - B in held-out avg@k at `step` (default: the pool's read step), paired by seed; None without a pair."""
    at = pool.step if step is None else step
    runs_a, runs_b = {r.seed: r for r in pool.of(a)}, {r.seed: r for r in pool.of(b)}
    seeds = sorted(set(runs_a) & set(runs_b))
    if not seeds:
        return None
    diffs = [value_at(runs_a[s], "step", at) - value_at(runs_b[s], "step", at) for s in seeds]
    mean, half = mean_ci(diffs)
    return {"a": a, "b": b, "mean": mean, "half": half, "seeds": seeds, "step": at, "diffs": diffs}


def relation(mean: float, half: float) -> str:
    """`above`, `below` or `tie`: above or below only where the 95% interval excludes 0 (one seed: `tie`)."""
    if math.isnan(mean) or math.isnan(half):
        return "tie"
    if mean - half > 0:
        return "above"
    if mean + half < 0:
        return "below"
    return "tie"


def _num(x: float) -> str:
    """+0.013; a value that would round to 0.000 keeps a fourth decimal, so a bound shows its sign."""
    return f"{x:+.4f}" if 0 < abs(x) < 0.0005 else f"{x:+.3f}"


def interval(mean: float, half: float) -> str:
    if math.isnan(half):
        return f"{_num(mean)} (one seed: no interval)"
    return f"{_num(mean)} [{_num(mean - half)}, {_num(mean + half)}]"


def sentence(d: dict) -> str:
    """`Seq-balance above GRPO n = 4: +0.013 [+0.007, +0.019] (seeds 0-4, step 100)`, or `... ties ...`."""
    rel = relation(d["mean"], d["half"])
    verb = {"above": "above", "below": "below", "tie": "ties with"}[rel]
    return (f"{name(d['a'])} {verb} {name(d['b'])}: {interval(d['mean'], d['half'])} "
            f"(seeds {','.join(map(str, d['seeds']))}, step {d['step']:g})")


def ordering(pool: PoolRuns, methods: list[str]) -> list[str]:
    """The methods of `pool` by mean avg@k at the read step, each next pair's relation in one sentence."""
    present = [m for m in methods if pool.of(m)]
    means = {m: float(np.nanmean([value_at(r, "step", pool.step) for r in pool.of(m)])) for m in present}
    ranked = sorted(present, key=lambda m: -means[m])
    lines = [f"Per step ({pool.name} pool, step {pool.step:g}), by mean held-out avg@k: "
             + ", ".join(f"{name(m)} {means[m]:.3f}" for m in ranked) + "."]
    for upper, lower in zip(ranked, ranked[1:]):
        d = paired_at_step(pool, upper, lower)
        if d is not None:
            lines.append(f"- {sentence(d)}")
    return lines


def across_pools(hard: dict, standard: dict) -> tuple[float, float]:
    """(mean, half-width) of hard's paired difference minus standard's: Welch's 95% t-interval."""
    from scipy import stats

    a, b = hard["diffs"], standard["diffs"]
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    mean = float(np.mean(a) - np.mean(b))
    se = math.sqrt(va + vb)
    if se == 0:
        return mean, 0.0
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return mean, float(stats.t.ppf(0.975, dof) * se)


def samples_per_prompt(pool: PoolRuns, method: str) -> float:
    values = [float(np.mean(r.step_values(K.BUDGET_GENERATED_SAMPLES))) / float(r.config.get("prompts_per_step") or 32)
              for r in pool.of(method)]
    return float(np.mean(values)) if values else math.nan


def claims_rows(pools: dict[str, PoolRuns]) -> list[list[str]]:
    """| claim | pool | verdict | number [95% interval] | read at | what equal samples and updates add |"""
    rows = []

    def per_step(claim: str, a: str, b: str, want: str, step: float | None = None, adds: str = "") -> None:
        for pool in pools.values():
            d = paired_at_step(pool, a, b, step)
            if d is None:
                continue
            rel = relation(d["mean"], d["half"])
            verdict = {("above", "above"): "holds", ("tie", "tie"): "holds", ("above", "tie"): "tie",
                       ("tie", "above"): "does not hold", ("tie", "below"): "does not hold",
                       ("below", "above"): "does not hold", ("below", "tie"): "does not hold",
                       ("above", "below"): "does not hold", ("atleast", "above"): "holds",
                       ("atleast", "tie"): "tie", ("atleast", "below"): "does not hold"}[(want, rel)]
            rows.append([claim, pool.name, verdict, interval(d["mean"], d["half"]),
                         f"step {d['step']:g}, seeds {','.join(map(str, d['seeds']))}", adds or matched_text(pool, a)])

    per_step("Seq-balance above GRPO n = 4 per step (v1-v3)", "ada-balance", "grpo", "above")
    per_step("balance above pos per step (v1)", "ada-balance", "ada-pos", "above")
    per_step("Seq-balance at least GRPO n = 16 per step (v3)", "ada-balance", "grpo-n16", "atleast")
    per_step("Est above GRPO n = 4 per step (v3)", "ada-est", "grpo", "above")
    per_step("Est about GRPO n = 8 per step (v3: a tie)", "ada-est", "grpo-n8", "tie")
    first_evals = {p.name: sorted({pt["step"] for r in p.runs for pt in r.points if K.EVAL_AVG_AT_K in pt and pt["step"] > 0})
                   for p in pools.values()}
    for pool in pools.values():
        if first_evals[pool.name] and first_evals[pool.name][0] < pool.step:
            early = first_evals[pool.name][0]
            d = paired_at_step(pool, "ada-balance", "grpo", early)
            if d is not None:
                rel = relation(d["mean"], d["half"])
                rows.append(["faster convergence early: Seq-balance above GRPO n = 4 at the first evaluation (v1-v3)",
                             pool.name, {"above": "holds", "tie": "tie", "below": "does not hold"}[rel],
                             interval(d["mean"], d["half"]),
                             f"step {early:g}, seeds {','.join(map(str, d['seeds']))}", matched_text(pool, "ada-balance")])
    if "hard" in pools and "standard" in pools:
        hard, standard = (paired_at_step(pools[p], "ada-balance", "grpo") for p in ("hard", "standard"))
        if hard and standard and len(hard["diffs"]) > 1 and len(standard["diffs"]) > 1:
            mean, half = across_pools(hard, standard)
            rel = relation(mean, half)
            rows.append(["larger gains on the hard pool: (Seq-balance - GRPO n = 4) hard minus standard (v1-v3)",
                         "both", {"above": "holds", "tie": "tie", "below": "does not hold"}[rel],
                         interval(mean, half) + " (Welch)", "each pool's read step", ""])
    for pool in pools.values():
        for method, paper in (("ada-balance", "comparable to n = 8-10 (v3)"), ("ada-est", "about n = 8 (v3)")):
            spp = samples_per_prompt(pool, method)
            if math.isnan(spp):
                continue
            low, high = (8, 10) if method == "ada-balance" else (7.5, 8.5)
            verdict = "holds" if low <= spp <= high else "does not hold"
            rows.append([f"{name(method)}'s cost {paper}", pool.name, verdict,
                         f"{spp:.1f} samples a prompt a step ({spp / 4:.2f}x GRPO n = 4)", "steps 1 to the read step", ""])
    return rows


def matched_text(pool: PoolRuns, method: str) -> str:
    """What Table C adds for `method`: its difference from each budget-matched control at the read step."""
    parts = []
    for row in matched_rows(pool):
        if row["method"] != method or not row["seeds"]:
            continue
        mean, half = row["step_ci"]
        parts.append(f"vs {', '.join(row['control'])} ({row['kind']}): {relation(mean, half)} {interval(mean, half)}")
    return "; ".join(parts) if parts else "no controls run"


def control_sentences(pool: PoolRuns) -> list[str]:
    """Each adaptive method against each budget-matched control at the read step (equal updates, about equal
    samples), one sentence a row of Table C, by the rule of `relation`."""
    out = []
    for row in matched_rows(pool):
        if not row["seeds"]:
            continue
        mean, half = row["step_ci"]
        verb = {"above": "above", "below": "below", "tie": "ties with"}[relation(mean, half)]
        m_s, c_s = row["samples_per_step"]
        kind = "GRPO n = 4 over more prompts" if row["kind"] == "b" else "GRPO at its samples a prompt"
        out.append(f"- {name(row['method'])} {verb} its control {', '.join(row['control'])} ({kind}; {m_s:,.0f} "
                   f"against {c_s:,.0f} samples a step): {interval(mean, half)} (seeds "
                   f"{','.join(map(str, row['seeds']))}, step {pool.step:g}, {pool.name} pool)")
    return out


def claims_table(pools: dict[str, PoolRuns]) -> str:
    lines = ["| claim (paper version) | pool | verdict | number [95% interval] | read at | at equal samples and updates "
             "(vs the budget-matched GRPO controls, read step) |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in claims_rows(pools)]
    return "\n".join(lines)


def book_blocks(paths: list[str | Path], methods: list[str]) -> dict[str, str]:
    """`{"orderings": ..., "claims": ...}`: the markdown the book holds between its markers."""
    from report.saved_runs import read_runs

    runs, _ = read_runs(paths, methods)
    pools = read_pools(runs)
    orderings, controls = [], []
    for pool in pools.values():
        orderings += ordering(pool, methods) + [""]
        controls += control_sentences(pool)
    out = {"orderings": "\n".join(orderings).rstrip() + "\n", "claims": claims_table(pools) + "\n"}
    if controls:
        out["controls"] = "\n".join(controls) + "\n"
    return out


BEGIN, END = "<!-- claims:begin {name} from {files} -->", "<!-- claims:end -->"


def blocks_in(text: str) -> list[tuple[str, list[str], str]]:
    """The book's blocks, in order: (name, the files its marker names, the text between the markers)."""
    out = []
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("<!-- claims:begin "):
            head = line.strip()[len("<!-- claims:begin "):-len(" -->")]
            block_name, _, files = head.partition(" from ")
            j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(END))
            out.append((block_name, files.split(), "".join(lines[i + 1:j])))
    return out


def write_blocks(page: str | Path, root: str | Path = ".") -> int:
    """Write every block of `page` again from the saved-runs files its marker names (paths from `root`);
    returns how many blocks it wrote."""
    lines = Path(page).read_text().splitlines(keepends=True)
    out, i, count = [], 0, 0
    while i < len(lines):
        out.append(lines[i])
        if lines[i].startswith("<!-- claims:begin "):
            head = lines[i].strip()[len("<!-- claims:begin "):-len(" -->")]
            block_name, _, files = head.partition(" from ")
            j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(END))
            out.append(book_blocks([Path(root) / f for f in files.split()], list(PAPER_NAMES))[block_name])
            count += 1
            i = j
            continue
        i += 1
    Path(page).write_text("".join(out))
    return count


def main(argv: list[str] | None = None) -> None:
    paths = argv if argv is not None else sys.argv[1:]
    if paths[:1] == ["--write"]:  # python -m report.claims --write docs/benchmarks/testbed.md
        for page in paths[1:]:
            print(f"{page}: {write_blocks(page)} blocks written from their saved runs")
        return
    for block_name, text in book_blocks(paths, list(PAPER_NAMES)).items():
        print(BEGIN.format(name=block_name, files=" ".join(paths)))
        print(text, end="")
        print(END)
        print()


if __name__ == "__main__":
    main()
