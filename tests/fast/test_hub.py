"""Hub ids for models and datasets, resolved through a hub cache built here (no network), and the
paper's evaluation suite loaded from it; offline or unreachable and not cached: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import dataset_card, put_in_hub_cache
from typer.testing import CliRunner

from ada_core.cli import INPUT_ERROR_EXIT, app
from ada_core.data import load_prompts
from ada_core.data.hub import (
    HubError,
    HubRef,
    dataset_files,
    parse_hub_id,
    pin,
    resolve,
)
from ada_core.data.suites import (
    SUITES,
    accuracy_table,
    load_suite,
    suite_metrics,
    weighted_average,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache under a fresh HF_HOME, offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_hub_ids_are_told_from_paths_and_names():
    assert parse_hub_id("Qwen/Qwen2.5-Math-1.5B") == HubRef("Qwen/Qwen2.5-Math-1.5B")
    assert parse_hub_id("Qwen/Qwen2.5-Math-1.5B@v1.0") == HubRef("Qwen/Qwen2.5-Math-1.5B", "v1.0")
    assert parse_hub_id("open-r1/OpenR1-Math-220k@" + "a" * 40).revision == "a" * 40
    for not_an_id in ("tiny", "data/math500.parquet", "/abs/path", "./x/y", "a/b/c", "../x", "x/y.jsonl"):
        assert parse_hub_id(not_an_id) is None, not_an_id


def test_a_hub_dataset_resolves_to_its_default_config_and_split_and_pins_its_commit(hub_cache):
    card = dataset_card({"train": "data/train-*", "test": "data/test-*"})
    commit = put_in_hub_cache(hub_cache, "dataset", "org/aime-set", {
        "README.md": card, "data/train-00000-of-00001.parquet": FIXTURES / "aime.parquet",
        "data/test-00000-of-00001.parquet": FIXTURES / "math500.parquet",
    })
    found = dataset_files(parse_hub_id("org/aime-set"))
    assert (found.config, found.split, found.snapshot.commit) == ("default", "train", commit)
    assert [p.name for p in found.files] == ["train-00000-of-00001.parquet"]
    assert pin("org/aime-set", "dataset") == f"org/aime-set@{commit}"
    prompts = load_prompts(f"org/aime-set@{commit}")
    assert len(prompts) == 2 and all(p.id.startswith("aime-set/") for p in prompts)
    assert {p.meta["hub_id"] for p in prompts} == {f"org/aime-set@{commit}"}
    assert len(load_prompts("org/aime-set", size=1, seed=0)) == 1
    with pytest.raises(HubError, match="no split 'validation'"):
        dataset_files(parse_hub_id("org/aime-set"), "validation")


def test_offline_and_not_cached_is_one_line_and_exit_2(hub_cache):
    runner = CliRunner()
    for args, what in ((["--model", "nobody/no-model"], "model 'nobody/no-model'"),
                       (["--dataset", "nobody/no-data@main"], "dataset 'nobody/no-data@main'")):
        result = runner.invoke(app, ["train", "--steps", "1", *args])
        assert result.exit_code == INPUT_ERROR_EXIT, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {what}: not a local path"), lines
        assert "HF_HUB_OFFLINE=1" in lines[0] and str(hub_cache) in lines[0]


def test_an_unreachable_hub_without_a_cache_is_one_line_too(hub_cache, monkeypatch, free_port):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(HubError, match=r"model 'nobody/no-model': not a local path, not in the hub cache .* could not be "
                                       r"reached") as err:
        resolve(HubRef("nobody/no-model"), "model", needs=["config.json"])
    assert "\n" not in str(err.value)
    commit = put_in_hub_cache(hub_cache, "model", "org/cached", {"config.json": "{}"})
    assert resolve(HubRef("org/cached"), "model").commit == commit  # the cache answers when the hub cannot


def test_the_paper_suite_loads_every_benchmark_from_the_hub_cache(hub_cache):
    files = {"weqweasdas/math500": "math500.parquet", "weqweasdas/minerva_math": "minerva.jsonl",
             "weqweasdas/olympiadbench": "olympiadbench.parquet",
             "weqweasdas/aime_hmmt_brumo_cmimc_amc23": "aime.parquet"}
    for repo, name in files.items():
        suffix = Path(name).suffix
        put_in_hub_cache(hub_cache, "dataset", repo, {
            "README.md": dataset_card({"train": f"data/train-*{suffix}"}), f"data/train-00000{suffix}": FIXTURES / name,
        })
    suite = SUITES["paper"]
    loaded = load_suite("paper")
    assert [b.hub_id for b, _ in loaded] == list(files)
    sizes = [len(prompts) for _, prompts in loaded]
    assert sizes == [3, 2, 2, 2]
    assert loaded[0][1][0].id.startswith("math500/") and loaded[2][1][0].answer  # OlympiadBench's list answer
    scores = [(b, len(p), acc, acc) for (b, p), acc in zip(loaded, [0.5, 0.25, 1.0, 0.0])]
    metrics = suite_metrics(scores)
    assert metrics["eval_suite/weighted/avg_at_k"] == pytest.approx((3 * 0.5 + 2 * 0.25 + 2 * 1.0) / 9)
    table = accuracy_table(suite, metrics, "tiny", k=32, max_tokens=4096, temperature=1.0)
    assert "| Model | Math500 | Minerva Math | Olympiad Bench | AIME-like | Weighted Average |" in table
    assert "| tiny | 50.0 | 25.0 | 100.0 | 0.0 | 44.4 |" in table and "avg@32" in table and "4096" in table


def test_weighted_average_reproduces_the_papers_table():
    # README of RLHFlow/Reinforce-Ada, Qwen2.5-Math-1.5B GRPO row: 74.2 34.4 38.4 16.2 -> 45.3 (45.4 unrounded)
    sizes = [b.size for b in SUITES["paper"].benchmarks]
    assert sizes == [500, 272, 675, 230]
    assert weighted_average(list(zip(sizes, [74.2, 34.4, 38.4, 16.2]))) == pytest.approx(45.38, abs=0.01)


def test_reading_local_datasets_leaves_the_hub_reachable(tmp_path):
    """`ada_core.data.hf` keeps `datasets` off the hub, but must not switch huggingface_hub offline for
    the hub ids resolved after it (it once set HF_HUB_OFFLINE=1 for the whole process)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    code = "import os, ada_core.data.hf; print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('HF_DATASETS_OFFLINE'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "1"]


def test_the_paper_profile_names_the_papers_model_data_and_evaluation():
    from ada_core.config import build_config

    config = build_config("ada-balance", "paper")
    assert (config.model, config.data.dataset) == ("Qwen/Qwen2.5-Math-1.5B", "open-r1/OpenR1-Math-220k")
    assert (config.eval_suite, config.eval_k, config.eval_max_tokens, config.eval_temperature) == ("paper", 32, 4096, 1.0)
    suite = SUITES["paper"]
    assert (suite.k, suite.max_tokens, suite.temperature) == (32, 4096, 1.0)
