"""The testbed's shipped start (ada_core/data/shipped/testbed/, `ada_core.training.shipped`): its files are its
manifest's, and a fresh home curating the testbed takes it, with no SFT and no sampling, so every CPU gets the
same start and the same curated, held-out and validation prompts. No model runs here: the start is copied,
hashed and its scores filtered. The recipe that trains it stays tested in tests/model/test_testbed.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ada_core.config import build_config
from ada_core.config.applies import run_facts
from ada_core.config.schema import data_seed
from ada_core.data import data_digest, prompts_digest, run_split
from ada_core.data.curation import load_curated, pass_rate_histogram
from ada_core.models import weights_sha256
from ada_core.training import shipped
from flows.paper_params import TESTBED_BANDS
from tasks.curation import _curate_dataset, curation_inputs, curation_key, key_inputs, training_config

TESTBED = shipped.SHIPPED_DIR / "testbed"


def _testbed() -> shipped.ShippedStart:
    found = [s for s in shipped.shipped_starts() if s.folder == TESTBED]
    assert found, f"no shipped start at {TESTBED} (benchmarks/testbed_start.py builds it)"
    return found[0]


def _pool_config(overrides: dict, **more):
    nested: dict = {}
    for key, value in {**overrides, **more}.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return build_config("grpo", "testbed", overrides=nested, facts=run_facts(True, "cpu"))


def test_the_shipped_files_are_their_manifests_and_small():
    start = _testbed()
    start.check_files()  # every file's sha256 and the weights' sha256
    manifest = start.manifest
    assert manifest["scores_sha256"] == shipped.file_sha256(TESTBED / shipped.SCORES)
    assert weights_sha256(TESTBED / shipped.MODEL_DIR) == manifest["model_sha256"]
    splits = shipped.read_gzip_json(TESTBED / shipped.SPLITS)
    import hashlib

    for name, band in manifest["bands"].items():
        for part in ("curated", "held_out", "validation"):
            ids = splits[name][part]
            assert hashlib.sha256("\n".join(ids).encode()).hexdigest() == band[f"{part}_ids_sha256"], (name, part)
        assert len(splits[name]["curated"]) == band["curated"]
    assert len(start.rates()) == manifest["recipe"]["pool_size"]
    assert sum(p.stat().st_size for p in TESTBED.rglob("*") if p.is_file()) < 5 * 2**20
    # the start is the paper's regime, as the recipe's test asks of a trained one (tests/model/test_testbed.py)
    shares = pass_rate_histogram(start.rates())
    assert 0.25 <= shares["1-2"] + shares["3-5"] <= 0.50 and shares["1-2"] >= 0.10, shares
    assert shares["16"] <= 0.30 and shares["0"] <= 0.40, shares


def test_the_testbed_profile_is_the_shipped_recipe_and_sft_shipped_false_is_the_recipe_key():
    """The profile's curation inputs, for every pool of the paper grid, are the manifest's recipe; with
    `sft.shipped` false they are the key a set curated from the recipe always had (no `start` in it)."""
    start = _testbed()
    for overrides in TESTBED_BANDS.values():
        config = _pool_config(overrides)
        inputs, found = key_inputs(**curation_inputs(config, data_seed(config)))
        assert found is not None and found.folder == start.folder and inputs["start"] == start.key
        off = _pool_config(overrides, **{"sft.shipped": False})
        recipe_inputs, none = key_inputs(**curation_inputs(off, data_seed(off)))
        assert none is None and "start" not in recipe_inputs
        assert curation_key(recipe_inputs) == curation_key({k: v for k, v in inputs.items() if k != "start"})
    other = _pool_config({}, sft_steps=1999)  # any input off the recipe: no shipped start
    assert key_inputs(**curation_inputs(other, data_seed(other)))[1] is None


def test_a_fresh_home_curates_the_testbed_from_the_shipped_start_in_seconds(tmp_path, monkeypatch):
    """Both pools of the paper grid in a fresh ADA_HOME: the manifest's weights, curated ids and held-out and
    validation ids (the flows' own training_config and run_split), no SFT trained, no prompt sampled: seconds
    on any machine, shown by what did not run rather than by a clock."""
    monkeypatch.setenv("ADA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    start = _testbed()
    splits = shipped.read_gzip_json(TESTBED / shipped.SPLITS)
    for name, overrides in TESTBED_BANDS.items():
        config = _pool_config(overrides)
        curated = _curate_dataset(**curation_inputs(config, data_seed(config)))
        assert curated["start"] == start.key
        assert curated["model_sha256"] == start.model_sha256 == weights_sha256(curated["model"])
        assert Path(curated["model"]) == tmp_path / "home" / "cache" / "sft" / f"shipped-{start.model_sha256[:16]}"
        result = load_curated(curated["dataset"])
        assert [p.id for p in result.prompts] == splits[name]["curated"]
        assert result.report["params"]["rates_from"].startswith("shipped start 'testbed'")
        assert start.manifest["files"][shipped.SCORES] in result.report["params"]["rates_from"]
        run_config = training_config(config, curated)
        assert run_config.model == curated["model"] and run_config.sft_steps == 0
        split = run_split(run_config.data, run_config.seed)
        assert [p.id for p in split.held_out] == splits[name]["held_out"]
        assert [p.id for p in split.validation] == splits[name]["validation"]
        band = start.manifest["bands"][name]
        assert data_digest(curated["dataset"]) == band["dataset_hash"]  # the run's `dataset_hash` parameter
        assert (prompts_digest(split.held_out), prompts_digest(split.validation)) == (
            band["held_out_digest"], band["validation_digest"])
        assert len(split.training) == band["training"]
    trained = [p.name for p in (tmp_path / "home" / "cache" / "sft").iterdir() if not p.name.startswith(".")]
    assert trained == [f"shipped-{start.model_sha256[:16]}"]  # the copy, and no SFT run of its own
    assert not (tmp_path / "home" / "models").exists()  # not even the base model was built


def test_a_damaged_shipped_start_is_refused_in_one_line(tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "shipped" / "testbed"
    shutil.copytree(TESTBED, copy)
    (copy / shipped.MODEL_DIR / "model.safetensors").write_bytes(b"not the weights")
    start = shipped.shipped_starts(tmp_path / "shipped")[0]
    monkeypatch.setenv("ADA_HOME", str(tmp_path / "home"))
    with pytest.raises(shipped.ShippedStartError, match="does not match its manifest.*sft.shipped: false"):
        start.install()
    with pytest.raises(shipped.ShippedStartError, match="generator changed"):
        start.check_pool("0" * 16)
    scores = (TESTBED / shipped.SCORES).read_bytes()
    (copy / shipped.SCORES).write_bytes(scores[:-1] + bytes([scores[-1] ^ 1]))
    with pytest.raises(shipped.ShippedStartError, match="scores.json.gz does not match its manifest"):
        start.rates()


def test_curation_given_pass_rates_samples_nothing_and_refuses_a_prompt_without_one():
    from ada_core.data.curation import curate
    from ada_core.protocols import SamplingParams
    from ada_core.records import Prompt

    class ParsesAll:
        def parses(self, answers):
            return [True] * len(answers)

    prompts = [Prompt(id=str(i), text=f"{i}+1=", answer=str(i + 1)) for i in range(4)]
    rates = {"0": 0.0, "1": 1 / 16, "2": 5 / 16, "3": 1.0}
    result = curate(prompts, None, ParsesAll(), SamplingParams(max_tokens=8), k=16, band=[1 / 16, 5 / 16],
                    rates=rates, rates_from="the test's rates")
    assert [p.id for p in result.prompts] == ["1", "2"] and result.prompts[1].difficulty == 5 / 16
    assert result.report["params"]["rates_from"] == result.report["stages"][-1]["rates_from"] == "the test's rates"
    with pytest.raises(ValueError, match="lack 1 of its 4 prompts, e.g. '3'"):
        curate(prompts, None, ParsesAll(), SamplingParams(max_tokens=8), k=16, rates={i: rates[i] for i in "012"})


def test_the_builder_writes_the_same_folder_from_the_same_start_and_scores(tmp_path):
    """benchmarks/testbed_start.py, handed the shipped model and scores, writes the shipped folder byte for byte
    (its manifest but for where and when it was built): what ships is what the builder makes of a recipe run."""
    import importlib.util
    import json

    from ada_core.data import load_prompts

    spec = importlib.util.spec_from_file_location("testbed_start", Path(__file__).resolve().parents[2]
                                                  / "benchmarks" / "testbed_start.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    start = _testbed()
    recipe = start.manifest["recipe"]
    pool = load_prompts(recipe["dataset"], size=recipe["pool_size"], seed=recipe["seed"])
    out = tmp_path / "testbed"
    manifest = builder.write_folder(out, recipe, TESTBED / shipped.MODEL_DIR, pool, start.rates(),
                                    start.manifest["built"])
    assert manifest == start.manifest
    assert json.loads((out / shipped.MANIFEST).read_text()) == start.manifest
