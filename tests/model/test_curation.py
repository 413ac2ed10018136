"""Curation for real: the SFT'd tiny model, the transformers engine and the math-verify pool."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace

import datasets
import pytest

from ada_core.data.curation import CurationResult, curate, load_curated, save_curated
from ada_core.data import generate_prompts, load_prompts
from ada_core.engines.transformers_engine import TransformersRolloutEngine
from ada_core.models import encode_prompts, load_policy, sft_warm_start
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt
from ada_core.rl.rewards import MathVerifier

SAMPLING = SamplingParams(temperature=1.0, max_tokens=6)
K, CEILING = 8, 0.875  # the tiny profile's curation_k and pass_rate_ceiling


@pytest.fixture(scope="session")
def curator(tiny_model):
    """Engine and verifier over the tiny model warm-started on the 100 one-digit sums."""
    sft = sft_warm_start(tiny_model, generate_prompts("arithmetic", 100, seed=0, difficulty=1),
                         steps=150, batch_size=64, seed=0)
    model, tokenizer = load_policy(sft)
    with MathVerifier(timeout_s=5.0, workers=2) as verifier:
        yield TransformersRolloutEngine(model, tokenizer), verifier, tokenizer


def _input_prompts(tokenizer) -> list[Prompt]:
    """One-digit sums the model knows, harder sums it does not, one duplicate and one bad gold answer."""
    prompts = generate_prompts("arithmetic", 12, seed=1, difficulty=1) + generate_prompts("arithmetic", 12, seed=2)
    original = prompts[0]
    a, b = original.text.removesuffix("=").split("+")
    prompts.append(replace(original, id="spaced-duplicate", text=f" {a} + {b} = ", meta=dict(original.meta)))
    prompts.append(Prompt(id="bad-gold", text="5+5=", answer="\\frac{", meta={"answer_format": "plain"}))
    encode_prompts(tokenizer, prompts)
    return prompts


def test_curate_real_model_invariants(curator):
    engine, verifier, tokenizer = curator
    prompts = _input_prompts(tokenizer)
    before = [(p.difficulty, dict(p.meta)) for p in prompts]
    result = curate(prompts, engine, verifier, SAMPLING, k=K, ceiling=CEILING, seed=0)
    report = result.report
    dedup_stage, verify_stage, difficulty_stage = report["stages"]

    # Counts add up, stage by stage and overall.
    assert report["input"] == len(prompts) == report["kept"] + report["dropped"]
    for stage in report["stages"]:
        assert stage["input"] - stage["kept"] == sum(d["count"] for d in stage["dropped"].values())
        assert all(d["count"] == len(d["ids"]) for d in stage["dropped"].values())
    assert dedup_stage["kept"] == verify_stage["input"] and verify_stage["kept"] == difficulty_stage["input"]

    # Each stage dropped what it should, with its reason.
    assert dedup_stage["dropped"]["duplicate"]["ids"] == ["spaced-duplicate"]
    assert dedup_stage["duplicate_of"] == {"spaced-duplicate": prompts[0].id}
    assert verify_stage["dropped"]["answer_unparseable"]["ids"] == ["bad-gold"]

    # The difficulty filter: kept rates in (0, ceiling], drops on the right side, rates in steps of 1/k.
    rates = difficulty_stage["pass_rates"]
    assert len(rates) == difficulty_stage["input"] and all(r * K == int(r * K) for r in rates.values())
    assert result.prompts, "some prompts should be kept"
    for p in result.prompts:
        assert 0.0 < p.difficulty <= CEILING and p.meta["pass_rate"] == p.difficulty == rates[p.id]
        assert p.prompt_ids and p.meta["curation_k"] == K
    never = difficulty_stage["dropped"]["never_solved"]["ids"]
    easy = difficulty_stage["dropped"]["too_easy"]["ids"]
    assert never or easy, "the filter should drop something on this mix"
    assert all(rates[i] == 0.0 for i in never) and all(rates[i] > CEILING for i in easy)
    assert sorted([p.id for p in result.prompts] + never + easy) == sorted(rates)
    # Known one-digit sums solve more often than unseen three-digit ones.
    one_digit = [r for i, r in rates.items() if "/d1/" in i]
    harder = [r for i, r in rates.items() if "/d3/" in i]
    assert sum(one_digit) / len(one_digit) > sum(harder) / len(harder)
    # The inputs are left alone.
    assert [(p.difficulty, p.meta) for p in prompts] == before

    # Same seed, same result, also from a worker thread (Prefect runs tasks in threads).
    again: list[CurationResult] = []
    worker = threading.Thread(target=lambda: again.append(
        curate(prompts, engine, verifier, SAMPLING, k=K, ceiling=CEILING, seed=0)))
    worker.start()
    worker.join()
    assert again[0].report == report and again[0].prompts == result.prompts


def test_save_and_load_curated_round_trip(curator, tmp_path):
    engine, verifier, tokenizer = curator
    result = curate(_input_prompts(tokenizer), engine, verifier, SAMPLING, k=4, ceiling=1.0, seed=3)
    folder = save_curated(result, tmp_path / "curated")
    assert sorted(os.listdir(folder)) == ["dataset", "prompts.jsonl", "report.json"]  # no temp files left behind
    loaded = load_curated(folder)
    arrow = datasets.load_from_disk(str(folder / "dataset"))  # the same set through Hugging Face datasets
    assert arrow["id"] == [p.id for p in loaded.prompts] and arrow["answer"] == [p.answer for p in loaded.prompts]
    assert [json.loads(m)["pass_rate"] for m in arrow["meta"]] == [p.meta["pass_rate"] for p in loaded.prompts]
    assert loaded.report == json.loads(json.dumps(result.report))
    assert [replace(p, prompt_ids=[]) for p in result.prompts] == loaded.prompts
    assert load_prompts(str(folder)) == loaded.prompts  # a curated set trains like any dataset
    assert all(p.meta["answer_format"] == "plain" for p in loaded.prompts)


def test_curate_rejects_bad_inputs(curator, tmp_path):
    engine, verifier, tokenizer = curator
    prompts = generate_prompts("arithmetic", 3, seed=0)
    with pytest.raises(ValueError, match="prompt_ids is empty; run models.encode_prompts"):
        curate(prompts, engine, verifier, SAMPLING, k=2, ceiling=0.5)
    encode_prompts(tokenizer, prompts)
    with pytest.raises(TypeError, match="needs a verifier with parses"):
        curate(prompts, engine, object(), SAMPLING, k=2, ceiling=0.5)
    with pytest.raises(ValueError, match="pass_rate_ceiling must be in"):
        curate(prompts, engine, verifier, SAMPLING, k=2, ceiling=0.0)
    with pytest.raises(ValueError, match="repeats prompt id"):
        curate(prompts + prompts[:1], engine, verifier, SAMPLING, k=2, ceiling=0.5)
    with pytest.raises(FileNotFoundError, match="not a curated set"):
        load_curated(tmp_path)
