"""Curating a training set, as the paper did for OpenR1-Math: dedup, verifiable answers, difficulty.

    prompts --dedup--> --answer parses--> --k samples, 0 < pass rate <= ceiling--> kept
                                                 (or low <= pass rate <= high with `band`)

Each stage records what it dropped and why (counts and ids), so `report["input"]` always equals
`report["kept"]` plus every stage's drops. Kept prompts carry the curating model's pass rate in
`prompt.difficulty` and `meta["pass_rate"]`; the report holds the pass rate of every prompt sampled.

The difficulty filter samples through a `RolloutEngine` (prompts must carry `prompt_ids`; see
`models.encode_prompts`) and scores through the verifier, so any engine plugs in. Answer checking
uses `MathVerifier.parses`, whose process pool keeps working inside Prefect's task threads.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ada_core.paths import staged, write_atomic
from ada_core.protocols import RolloutEngine, SamplingParams, Verifier
from ada_core.records import Prompt

PROMPTS_FILE = "prompts.jsonl"
REPORT_FILE = "report.json"
ARROW_DIR = "dataset"  # the same prompts as a Hugging Face dataset (`datasets.load_from_disk`)

# LaTeX that changes spacing or bracket size, not meaning: `\,` `\;` `\:` `\!` `\ ` `\quad` `\left`...
_LATEX_SPACING = re.compile(r"\\[,;:! ]|\\q?quad\b|\\(?:left|right|displaystyle)\b|~")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac\b")
_SPACE_NEAR_SYMBOL = re.compile(r" ?([^\w\s]) ?")


def normalise_text(text: str) -> str:
    r"""The form two prompts must share to count as duplicates.

    Lower case; LaTeX spacing and sizing commands dropped; `\dfrac`/`\tfrac` read as `\frac`;
    whitespace runs collapsed, and removed next to symbols (so `x + 1` equals `x+1`, while
    `2 3` stays distinct from `23`).

    >>> normalise_text(r"Find  $\left( x \, + 1 \right)$ if X=\dfrac{1}{2}.")
    'find$(x+1)$if x=\\frac{1}{2}.'
    """
    text = _LATEX_SPACING.sub(" ", text.lower())
    text = _FRAC_VARIANTS.sub(r"\\frac", text)
    text = re.sub(r"\s+", " ", text).strip()
    return _SPACE_NEAR_SYMBOL.sub(r"\1", text)


@dataclass
class CurationResult:
    """The kept prompts and the report of what each stage dropped and why."""

    prompts: list[Prompt]
    report: dict[str, Any] = field(default_factory=dict)


def dedup(prompts: Sequence[Prompt]) -> tuple[list[Prompt], dict[str, Any]]:
    """Keep the first prompt of each normalised text; later copies are dropped as `duplicate`.

    The normalised texts come from a fingerprint-cached `datasets.map` (`hf.text_keys`), so a
    second curation of the same pool skips the regexes.
    """
    from ada_core.data import prompts_digest
    from ada_core.data.hf import text_keys

    keys = text_keys(prompts, normalise_text, prompts_digest(prompts)) if prompts else []
    first: dict[str, str] = {}
    kept, duplicate_of = [], {}
    for p, key in zip(prompts, keys):
        if key in first:
            duplicate_of[p.id] = first[key]
        else:
            first[key] = p.id
            kept.append(p)
    stage = _stage("dedup", len(prompts), kept, {"duplicate": list(duplicate_of)})
    stage["duplicate_of"] = duplicate_of
    return kept, stage


def verifiable(prompts: Sequence[Prompt], verifier) -> tuple[list[Prompt], dict[str, Any]]:
    """Keep prompts whose reference answer math-verify parses; others are `answer_unparseable`."""
    if not callable(getattr(verifier, "parses", None)):
        raise TypeError(f"curation needs a verifier with parses(answers) (MathVerifier); got {type(verifier).__name__}")
    ok = verifier.parses([p.answer for p in prompts])
    kept = [p for p, good in zip(prompts, ok) if good]
    dropped = [p.id for p, good in zip(prompts, ok) if not good]
    return kept, _stage("verify", len(prompts), kept, {"answer_unparseable": dropped})


def pass_rates(
    prompts: Sequence[Prompt],
    engine: RolloutEngine,
    verifier: Verifier,
    sampling: SamplingParams,
    k: int,
    positive_threshold: float = 0.7,
    chunk_prompts: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """Fraction of k samples per prompt whose reward exceeds `positive_threshold`.

    Prompts go to the engine `chunk_prompts` at a time, chunk c with seed `sampling.seed + c`,
    so a long curation shows progress and stays reproducible. `progress(done, total)` is called
    with the prompts scored so far after each chunk (the flows turn it into a Prefect artifact).
    """
    from tqdm.auto import tqdm

    for p in prompts:
        if not p.prompt_ids:
            raise ValueError(f"prompt {p.id}: prompt_ids is empty; run models.encode_prompts before curating")
    rates: dict[str, float] = {}
    base_seed = sampling.seed if sampling.seed is not None else 0
    starts = range(0, len(prompts), chunk_prompts)
    for c, start in enumerate(tqdm(starts, desc=f"curation k={k}", unit="chunk", disable=len(starts) < 2)):
        chunk = list(prompts[start : start + chunk_prompts])
        groups = engine.generate([(p, k) for p in chunk], replace(sampling, seed=base_seed + c))
        items = [(p, s.text) for p, samples in zip(chunk, groups) for s in samples]
        verdicts = verifier.verify(items)
        for i, p in enumerate(chunk):
            rewards = [v.reward for v in verdicts[i * k : (i + 1) * k]]
            rates[p.id] = sum(r > positive_threshold for r in rewards) / k
        if progress is not None:
            progress(min(start + chunk_prompts, len(prompts)), len(prompts))
    return rates


# The paper's start regime read at k = 16 (arXiv 2510.04996: its data keeps 1-5 correct of 16, its hard set 1-2):
# bands of correct samples, inclusive.
HISTOGRAM_BANDS = {"0": (0, 0), "1-2": (1, 2), "3-5": (3, 5), "6-15": (6, 15), "16": (16, 16)}


def pass_rate_histogram(rates: dict[str, float] | Sequence[float], k: int = 16) -> dict[str, float]:
    """Share of prompts in each of `HISTOGRAM_BANDS` (correct samples of k = 16), from pass rates measured at k."""
    if k != 16:
        raise ValueError(f"the histogram's bands are counts of 16; got pass rates at k = {k}")
    values = list(rates.values()) if isinstance(rates, dict) else list(rates)
    if not values:
        raise ValueError("pass_rate_histogram: no pass rates")
    counts = [round(r * k) for r in values]
    return {band: sum(low <= c <= high for c in counts) / len(counts) for band, (low, high) in HISTOGRAM_BANDS.items()}


def curate(
    prompts: Sequence[Prompt],
    engine: RolloutEngine,
    verifier: Verifier,
    sampling: SamplingParams,
    k: int = 16,
    ceiling: float = 0.3125,
    seed: int = 0,
    positive_threshold: float = 0.7,
    progress: Callable[[int, int], None] | None = None,
    band: Sequence[float] | None = None,
    rates: dict[str, float] | None = None,
    rates_from: str | None = None,
) -> CurationResult:
    """Dedup, drop unparseable answers, then keep prompts with 0 < pass rate <= ceiling, or with
    band[0] <= pass rate <= band[1] when `band` is given (the paper's hard set: 1-2 correct of 16 is
    k = 16, band (1/16, 2/16)); the band replaces the ceiling rule.

    `rates` are pass rates known already (a shipped start's scores: `training.shipped`), measured at `k`
    with `sampling` and `seed`: every prompt left after the first two stages must have one, nothing is
    sampled and `engine` may be None. `rates_from` says where they came from; the report's difficulty
    stage and params record it (`sampled` when they were sampled here).

    `k`, `ceiling` and `band` come from `DataConfig` (`curation_k`, `pass_rate_ceiling`,
    `keep_pass_rate`); `seed` seeds the sampling. Input prompts are not modified: kept ones are copies
    with the pass rate filled in. Drops: `never_solved` (rate 0, below the band), `too_easy` (above the
    ceiling or the band) and, with a band whose low end is above 0, `too_hard` (solved, but below it).
    """
    if k < 1:
        raise ValueError(f"curation k must be >= 1, got {k}")
    if not 0.0 < ceiling <= 1.0:
        raise ValueError(f"pass_rate_ceiling must be in (0, 1], got {ceiling}")
    if band is not None and (len(band) != 2 or not 0.0 <= band[0] <= band[1] <= 1.0):
        raise ValueError(f"keep_pass_rate must be [low, high] with 0 <= low <= high <= 1, got {list(band)}")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"curation input repeats prompt id {dup!r}; ids must be unique")

    stages = []
    kept, stage = dedup(prompts)
    stages.append(stage)
    kept, stage = verifiable(kept, verifier)
    stages.append(stage)
    if rates is None:
        rates = pass_rates(kept, engine, verifier, replace(sampling, seed=seed), k, positive_threshold,
                           progress=progress)
        rates_from = "sampled"
    else:
        missing = [p.id for p in kept if p.id not in rates]
        if missing:
            raise ValueError(f"curation was given pass rates ({rates_from or 'known rates'}) that lack {len(missing)} "
                             f"of its {len(kept)} prompts, e.g. {missing[0]!r}")
        rates = {p.id: float(rates[p.id]) for p in kept}
        rates_from = rates_from or "given"
    eps = 1e-9  # rates are multiples of 1/k: compare with a tolerance so 2/16 <= 0.125 holds
    if band is None:
        def keep(rate: float) -> bool:
            return 0.0 < rate <= ceiling + eps
        high = ceiling
    else:
        def keep(rate: float) -> bool:
            return band[0] - eps <= rate <= band[1] + eps
        high = band[1]
    never = [p.id for p in kept if rates[p.id] == 0.0 and not keep(0.0)]
    easy = [p.id for p in kept if rates[p.id] > high + eps]
    hard = [p.id for p in kept if 0.0 < rates[p.id] and not keep(rates[p.id]) and rates[p.id] <= high + eps]
    survivors = []
    for p in kept:
        if keep(rates[p.id]):
            q = replace(p, meta=copy.deepcopy(p.meta), prompt_ids=list(p.prompt_ids))
            q.difficulty = rates[p.id]
            q.meta["pass_rate"] = rates[p.id]
            q.meta["curation_k"] = k
            survivors.append(q)
    dropped = {"never_solved": never, "too_easy": easy, **({"too_hard": hard} if band is not None else {})}
    stage = _stage("difficulty", len(kept), survivors, dropped)
    stage["pass_rates"] = rates
    stage["rates_from"] = rates_from
    stages.append(stage)

    report = {
        "input": len(prompts),
        "kept": len(survivors),
        "dropped": sum(s["input"] - s["kept"] for s in stages),
        "params": {"k": k, "ceiling": ceiling, "band": list(band) if band is not None else None, "seed": seed,
                   "positive_threshold": positive_threshold,
                   "temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": sampling.max_tokens,
                   "rates_from": rates_from},
        "stages": stages,
    }
    return CurationResult(prompts=survivors, report=report)


def _stage(name: str, n_in: int, kept: Sequence[Prompt], dropped: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "stage": name,
        "input": n_in,
        "kept": len(kept),
        "dropped": {reason: {"count": len(ids), "ids": ids} for reason, ids in dropped.items()},
    }


# ---------------------------------------------------------------------------------------------
# Saving


def save_curated(result: CurationResult, directory: str | Path) -> Path:
    """Write `prompts.jsonl` (Prompt records without token ids), `report.json` and `dataset/`, each atomically.

    `data.load_prompts(directory)` reads the set back as training prompts from prompts.jsonl (the
    file its digest is taken of); `dataset/` holds the same records as an Arrow dataset written by
    `save_to_disk` (meta as JSON), for `datasets.load_from_disk` and notebooks.
    """
    from ada_core.data.hf import save_prompts

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for p in result.prompts:
        record = asdict(p)
        record.pop("prompt_ids")  # tokenizer-specific; the trainer re-encodes
        lines.append(json.dumps(record, ensure_ascii=False))
    staging = Path(tempfile.mkdtemp(prefix=f".{ARROW_DIR}.", dir=out))
    try:
        with staged(staging, f"the curated set {out.name}"):  # a full disk: one line naming the folder
            save_prompts(result.prompts, staging / ARROW_DIR)  # first: a failure here changes nothing
            write_atomic(out / PROMPTS_FILE, "".join(line + "\n" for line in lines))
            write_atomic(out / REPORT_FILE, json.dumps(result.report, indent=2, ensure_ascii=False) + "\n")
        old = out / ARROW_DIR
        if old.exists():
            old.rename(staging / "old")
        (staging / ARROW_DIR).rename(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def load_curated(directory: str | Path) -> CurationResult:
    from ada_core.data import load_dataset_file

    folder = Path(directory)
    report_file = folder / REPORT_FILE
    if not report_file.is_file():
        raise FileNotFoundError(f"{folder} is not a curated set: no {REPORT_FILE}")
    prompts_file = folder / PROMPTS_FILE
    prompts = load_dataset_file(prompts_file, schema="prompts") if prompts_file.stat().st_size else []
    return CurationResult(prompts=prompts, report=json.loads(report_file.read_text()))
