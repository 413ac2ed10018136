"""Named evaluation suites: benchmarks by hub id, scored avg@k, reported as the paper's accuracy table.

The `paper` suite is Reinforce-Ada's evaluation (arXiv 2510.04996, Table 1; the reference repo's
scripts/eval_model.sh and eval/gen_data.py): MATH500, Minerva Math, OlympiadBench and the AIME-like
set (AIME24, AIME25, HMMT24, HMMT25, BRUMO25, CMIMC25, AMC23: 230 problems in one set), each the
`train` split of the hub dataset the reference evaluates on; avg@32 at temperature 1.0 with at most
4096 generated tokens; the weighted average weighs each benchmark by its number of prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ada_core.data import hub
from ada_core.errors import ConfigError, InputError
from ada_core.records import Prompt


@dataclass(frozen=True)
class Benchmark:
    name: str
    """The column header of the accuracy table, and the metric key (`eval_suite/<key>/avg_at_k`)."""
    hub_id: str
    split: str | None = "train"
    size: int | None = None
    """Prompts the published set has (documentation: the weights are the prompts actually loaded)."""

    @property
    def key(self) -> str:
        return self.name.lower().replace(" ", "_").replace("-", "_")


@dataclass(frozen=True)
class Suite:
    name: str
    benchmarks: tuple[Benchmark, ...]
    k: int
    """Samples per prompt for avg@k."""
    max_tokens: int
    """Generated-token limit per sample."""
    temperature: float
    source: str


SUITES: dict[str, Suite] = {
    "paper": Suite(
        name="paper",
        benchmarks=(
            Benchmark("Math500", "weqweasdas/math500", size=500),
            Benchmark("Minerva Math", "weqweasdas/minerva_math", size=272),
            Benchmark("Olympiad Bench", "weqweasdas/olympiadbench", size=675),
            # AIME24 (30), AIME25 (30), HMMT24 (30), HMMT25 (30), BRUMO25 (30), CMIMC25 (40), AMC23 (40).
            Benchmark("AIME-like", "weqweasdas/aime_hmmt_brumo_cmimc_amc23", size=230),
        ),
        k=32,  # scripts/eval_model.sh: K=32
        max_tokens=4096,  # eval/gen_data.py: max_new_tokens=4096
        temperature=1.0,  # eval/gen_data.py: temperature=1.0, top_p=1.0
        source="arXiv 2510.04996 Table 1; RLHFlow/Reinforce-Ada scripts/eval_model.sh, eval/gen_data.py",
    ),
}

WEIGHTED = "Weighted Average"
PREFIX = "eval_suite"


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise InputError(f"eval suite {name!r}: unknown; choose from {sorted(SUITES)}")
    return SUITES[name]


def pin_benchmarks(name: str, given: Sequence[str] = ()) -> list[str]:
    """Every benchmark of suite `name` as `org/name@<commit>`: as `given` pins it, else its hub id resolved
    now (downloaded where the hub is reachable, from the cache otherwise), in the suite's order.

    A run pins them when it starts, as it pins its model and data: config.yaml then records the
    revisions it scores, a resume scores the same ones, and every evaluation of the run reads them."""
    suite = get_suite(name)
    try:
        check_revisions(name, given)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    pinned = {ref.repo: text for text in given if (ref := hub.parse_hub_id(text)) is not None}
    return [pinned.get(b.hub_id) or hub.dataset_files(hub.parse_hub_id(b.hub_id), b.split).snapshot.pinned
            for b in suite.benchmarks]


def load_suite(name: str, revisions: Sequence[str] = ()) -> list[tuple[Benchmark, list[Prompt]]]:
    """Every benchmark of the suite with its prompts (ids `<benchmark key>/<row id>`), resolved through the
    hub at the commits `revisions` pin (`pin_benchmarks`; a benchmark they leave out: at the hub's main)."""
    out = []
    for bench, pinned in zip(get_suite(name).benchmarks, pin_benchmarks(name, revisions)):
        prompts = hub.load_hub_prompts(hub.parse_hub_id(pinned), bench.split)
        for p in prompts:
            p.id = f"{bench.key}/{p.id}"
            p.source = bench.key
        out.append((bench, prompts))
    return out


def check_revisions(name: str | None, revisions: Sequence[str]) -> None:
    """Refuse `eval_suite_revisions` entries that are not `org/name@<commit>` of a benchmark of suite `name`,
    or that pin one benchmark twice (ValueError naming the entry)."""
    if not revisions:
        return
    if name is None:
        raise ValueError("eval_suite_revisions pins the benchmarks of eval_suite, and eval_suite is null")
    repos = [b.hub_id for b in get_suite(name).benchmarks]
    seen: set[str] = set()
    for text in revisions:
        ref = hub.parse_hub_id(text)
        if ref is None or ref.revision is None or not hub.is_commit(ref.revision):
            raise ValueError(f"eval_suite_revisions: {text!r} is not a hub id pinned to a commit (org/name@<40 hex>)")
        if ref.repo not in repos:
            raise ValueError(f"eval_suite_revisions: {ref.repo} is no benchmark of suite {name!r} ({', '.join(repos)})")
        if ref.repo in seen:
            raise ValueError(f"eval_suite_revisions: {ref.repo} is pinned twice")
        seen.add(ref.repo)


def metric_key(bench_key: str, what: str = "avg_at_k") -> str:
    return f"{PREFIX}/{bench_key}/{what}"


WEIGHTED_KEY = metric_key("weighted", "avg_at_k")


def suite_metrics(scores: Sequence[tuple[Benchmark, int, float, float]]) -> dict[str, float]:
    """Metrics of `(benchmark, prompts, avg@k, pass@k)` rows: per benchmark, and the prompt-weighted average."""
    out: dict[str, float] = {}
    for bench, n, avg, pass_k in scores:
        out[metric_key(bench.key)] = avg
        out[metric_key(bench.key, "pass_at_k")] = pass_k
        out[metric_key(bench.key, "prompts")] = float(n)
    out[WEIGHTED_KEY] = weighted_average([(n, avg) for _, n, avg, _ in scores])
    return out


def weighted_average(rows: Sequence[tuple[int, float]]) -> float:
    """Σ nᵢ·accᵢ / Σ nᵢ: the paper's weighted average (by number of prompts).

    >>> round(weighted_average([(500, 0.742), (272, 0.344), (675, 0.384), (230, 0.162)]), 4)
    0.4538
    """
    total = sum(n for n, _ in rows)
    return sum(n * acc for n, acc in rows) / total if total else float("nan")


def accuracy_table(suite: Suite, metrics: dict[str, float], model: str, k: int, max_tokens: int,
                   temperature: float) -> str:
    """The paper's Table 1 layout as markdown: one row, a column per benchmark (avg@k in %), then the weighted average."""
    headers = [b.name for b in suite.benchmarks] + [WEIGHTED]
    cells = [f"{100 * metrics[metric_key(b.key)]:.1f}" for b in suite.benchmarks] + [f"{100 * metrics[WEIGHTED_KEY]:.1f}"]
    sizes = ", ".join(f"{b.name} {int(metrics[metric_key(b.key, 'prompts')])}" for b in suite.benchmarks)
    return "\n".join([
        f"| Model | {' | '.join(headers)} |",
        f"| :--- | {' | '.join(':---' for _ in headers)} |",
        f"| {model} | {' | '.join(cells)} |",
        "",
        (f"avg@{k} accuracy (%) at temperature {temperature:g} with at most {max_tokens} generated tokens; the "
         f"weighted average weighs each benchmark by its prompts ({sizes}). Suite `{suite.name}`: {suite.source}."),
    ]) + "\n"


def suite_overrides(name: str, k: int | None = None, max_tokens: int | None = None,
                    temperature: float | None = None) -> dict:
    """Config overrides that score suite `name`: its k, token limit and temperature unless given."""
    suite = get_suite(name)
    return {"eval_suite": suite.name, "eval_k": k or suite.k, "eval_max_tokens": max_tokens or suite.max_tokens,
            "eval_temperature": temperature or suite.temperature}
