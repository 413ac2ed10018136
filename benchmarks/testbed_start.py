"""Build the testbed's shipped start (ada_core/data/shipped/testbed/) from its recipe.

    .venv/bin/python benchmarks/testbed_start.py                      # train and score here, then write it
    .venv/bin/python benchmarks/testbed_start.py --curated DIR --model DIR   # package a curation made already

The recipe is the `testbed` profile's curation inputs (tasks/curation.py `curation_inputs`, data seed 0) with
`sft.shipped` false: the 2,000-step SFT warm start of `tiny-l4` (cached under ADA_HOME/cache/sft/) and the
scoring of the 20,000-prompt `arithmetic` pool at k = 16 (`training.start.curate_for_model`), 6-25 minutes
on one core. `--curated` and `--model` package an earlier run of the same (its report.json must hold the
recipe's params and every pool prompt's pass rate, its model the recipe's SFT settings).

What it writes (`training.shipped` reads it): the model folder; every pool prompt's correct samples of 16;
for each curation band of the paper grid (flows/paper_params.py, TESTBED_BANDS) the curated ids and the
held-out and validation ids the training split draws from them (the flows' own `training_config` and
`run_split`, data seed 0); and manifest.json with the recipe, the sha256 of every file, the weights'
sha256 and the machine and date. Same inputs, same bytes: the gzip files carry no time or name.
Then update the sha256 values in docs/benchmarks/testbed.md (Reproducibility).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ada_core.config import build_config  # noqa: E402
from ada_core.config.schema import data_seed  # noqa: E402
from ada_core.training import shipped  # noqa: E402
from ada_core.training.start_eval import cpu_model  # noqa: E402
from tasks.curation import curation_inputs  # noqa: E402
from flows.param_form import nest_dotted  # noqa: E402

PROFILE = "testbed"


def recipe_inputs(config) -> dict:
    """The curation inputs of the profile, as `curate_for_model` takes them, with the shipped start off."""
    inputs = curation_inputs(config, data_seed(config))
    for key in ("home", "dataset_digest"):  # the Prefect task's cache key, not curation's
        inputs.pop(key)
    inputs["band"] = inputs.pop("keep_pass_rate")
    inputs["shipped"] = False
    return inputs


def train(config, work: Path) -> tuple[Path, Path]:
    """Warm-start and score from the recipe (`sft.shipped` false); returns (curated folder, model folder)."""
    from ada_core.training.start import curate_for_model

    made = curate_for_model(**recipe_inputs(config), out_dir=work / "curated")
    return work / "curated", Path(made["model"])


def check_against_recipe(recipe: dict, report: dict, model_dir: Path, pool_ids: list[str]) -> dict[str, float]:
    """The report's params and the model's sft.json are the recipe's, and the report scored every pool
    prompt; returns the pass rates."""
    params = report["params"]
    want = {"k": recipe["k"], "seed": recipe["seed"], "temperature": recipe["temperature"], "top_p": 1.0,
            "max_tokens": recipe["max_tokens"], "positive_threshold": recipe["positive_threshold"]}
    wrong = {key: (params.get(key), value) for key, value in want.items() if params.get(key) != value}
    if params.get("rates_from", "sampled") != "sampled":
        wrong["rates_from"] = (params["rates_from"], "sampled")
    sft = json.loads((model_dir / "sft.json").read_text())
    for key, value in {"steps": recipe["sft_steps"], "lr": recipe["sft"]["lr"],
                       "batch_size": recipe["sft"]["batch_size"], "seed": recipe["seed"]}.items():
        if sft.get(key) != value:
            wrong[f"sft.json {key}"] = (sft.get(key), value)
    if report["input"] != recipe["pool_size"]:
        wrong["pool"] = (report["input"], recipe["pool_size"])
    if wrong:
        raise SystemExit(f"the curation does not answer the recipe (got, want): {wrong}")
    difficulty = next(s for s in report["stages"] if s["stage"] == "difficulty")
    rates = difficulty["pass_rates"]
    unscored = set(pool_ids) - set(rates)
    dropped = sum(s["input"] - s["kept"] for s in report["stages"] if s["stage"] != "difficulty")
    if len(unscored) != dropped:
        raise SystemExit(f"{len(unscored)} pool prompts have no pass rate, but dedup and verify dropped {dropped}")
    return rates


def band_splits(name: str, config_overrides: dict, pool, rates: dict[str, float], model_dir: Path, work: Path) -> dict:
    """One pool of the paper grid from the rates: its curated ids and its run split, as the flows draw it."""
    from ada_core.data import data_digest, prompts_digest, run_split
    from ada_core.data.curation import curate, save_curated
    from ada_core.protocols import SamplingParams
    from ada_core.rl.rewards import MathVerifier
    from tasks.curation import training_config

    from ada_core.config.applies import run_facts

    config = build_config("grpo", PROFILE, overrides=nest_dotted(config_overrides), facts=run_facts(True, "cpu"))
    sampling = SamplingParams(temperature=config.rollout.temperature, top_p=1.0, max_tokens=config.rollout.max_tokens,
                              seed=data_seed(config))
    with MathVerifier() as verifier:
        result = curate(pool, None, verifier, sampling, k=config.data.curation_k, ceiling=config.data.pass_rate_ceiling,
                        seed=data_seed(config), positive_threshold=config.sampler.positive_threshold,
                        band=config.data.keep_pass_rate, rates=rates, rates_from="the recipe's scores")
    folder = save_curated(result, work / name)
    run_config = training_config(config, {"kept": len(result.prompts), "pool": len(pool), "model": str(model_dir),
                                          "dataset": str(folder)})
    split = run_split(run_config.data, run_config.seed)
    return {
        "keep_pass_rate": list(config.data.keep_pass_rate),
        "curated": [p.id for p in result.prompts],
        "training": len(split.training),
        "held_out": [p.id for p in split.held_out],
        "validation": [p.id for p in split.validation],
        "dataset_hash": data_digest(str(folder)),  # what a run logs as `dataset_hash`: its prompts.jsonl
        "held_out_digest": prompts_digest(split.held_out),
        "validation_digest": prompts_digest(split.validation),
    }


def ids_sha256(ids: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def write_folder(out: Path, recipe: dict, model_dir: Path, pool, rates: dict[str, float], built: dict) -> dict:
    from ada_core.data import prompts_digest
    from ada_core.models import weights_sha256
    from flows.paper_params import TESTBED_BANDS

    k = recipe["k"]
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the package folder is readable by all
    try:
        (staging / shipped.MODEL_DIR).mkdir()
        for f in sorted(model_dir.iterdir()):
            if f.is_file() and f.name != "ada_model.json":  # the build marker: the home's, not the model's
                shutil.copyfile(f, staging / shipped.MODEL_DIR / f.name)
        correct = {pid: round(rate * k) for pid, rate in rates.items()}
        assert all(abs(correct[pid] / k - rate) < 1e-9 for pid, rate in rates.items()), "rates are not multiples of 1/k"
        shipped.gzip_json({"k": k, "correct": correct}, staging / shipped.SCORES)
        work = Path(tempfile.mkdtemp(prefix="bands.", dir=staging))
        bands = {name: band_splits(name, overrides, pool, rates, staging / shipped.MODEL_DIR, work)
                 for name, overrides in TESTBED_BANDS.items()}
        shutil.rmtree(work)
        shipped.gzip_json({name: {key: band[key] for key in ("curated", "held_out", "validation")}
                           for name, band in bands.items()}, staging / shipped.SPLITS)
        files = {str(p.relative_to(staging)): shipped.file_sha256(p)
                 for p in sorted(staging.rglob("*")) if p.is_file()}
        manifest = {
            "format": shipped.FORMAT,
            "name": out.name,
            "about": "The testbed's warm start and curation scores, trained once from the recipe (benchmarks/"
                     "testbed_start.py rebuilds it; docs/benchmarks/testbed.md, Reproducibility).",
            "recipe": recipe,
            "pool_digest": prompts_digest(pool),
            "model_sha256": weights_sha256(staging / shipped.MODEL_DIR),
            "scores_sha256": files[shipped.SCORES],
            "bands": {name: {"keep_pass_rate": band["keep_pass_rate"], "curated": len(band["curated"]),
                             "training": band["training"], "held_out": len(band["held_out"]),
                             "validation": len(band["validation"]),
                             "curated_ids_sha256": ids_sha256(band["curated"]),
                             "held_out_ids_sha256": ids_sha256(band["held_out"]),
                             "validation_ids_sha256": ids_sha256(band["validation"]),
                             "dataset_hash": band["dataset_hash"],
                             "held_out_digest": band["held_out_digest"],
                             "validation_digest": band["validation_digest"]}
                      for name, band in bands.items()},
            "files": files,
            "built": built,
        }
        (staging / shipped.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=shipped.SHIPPED_DIR / PROFILE, help="the folder to (re)write")
    parser.add_argument("--curated", type=Path, help="a curated folder of the recipe (its report.json) to package")
    parser.add_argument("--model", type=Path, help="the warm-started model folder that curated it")
    parser.add_argument("--date", help="when the curation ran, for the manifest (default: now)")
    args = parser.parse_args(argv)
    if (args.curated is None) != (args.model is None):
        parser.error("--curated and --model go together")

    from ada_core.data import load_prompts
    from ada_core.training.shipped import recipe as make_recipe

    config = build_config("grpo", PROFILE)
    inputs = recipe_inputs(config)
    recipe = make_recipe(inputs["model"], inputs["sft_steps"], inputs["dataset"], inputs["pool_size"], inputs["seed"],
                         inputs["k"], inputs["max_tokens"], inputs["temperature"], inputs["positive_threshold"],
                         inputs["sft"])
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="testbed_start.") as tmp:
        curated, model_dir = (args.curated, args.model) if args.curated else train(config, Path(tmp))
        pool = load_prompts(recipe["dataset"], size=recipe["pool_size"], seed=recipe["seed"])
        report = json.loads((curated / "report.json").read_text())
        rates = check_against_recipe(recipe, report, model_dir, [p.id for p in pool])
        import torch

        built = {"cpu": cpu_model(), "machine": platform.machine(),
                 "kernels": torch.backends.cpu.get_cpu_capability(),  # what torch's vector kernels ran on
                 "torch": torch.__version__,
                 "python": platform.python_version(),
                 "date": args.date or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        manifest = write_folder(args.out, recipe, model_dir, pool, rates, built)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(json.dumps({"out": str(args.out), "bytes": size, "model_sha256": manifest["model_sha256"],
                      "scores_sha256": manifest["scores_sha256"],
                      "bands": {n: b["curated"] for n, b in manifest["bands"].items()},
                      "seconds": round(time.time() - started, 1)}, indent=1))


if __name__ == "__main__":
    main()
