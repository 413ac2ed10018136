"""Hub ids for models and datasets, resolved through a hub cache built here (no network), and the
paper's evaluation suite loaded from it; offline or unreachable and not cached: one line, exit 2."""

from __future__ import annotations

import functools
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
        resolve(HubRef("nobody/no-model"), "model", ["config.json"])
    assert "\n" not in str(err.value)
    commit = put_in_hub_cache(hub_cache, "model", "org/cached", {"config.json": "{}"})
    assert resolve(HubRef("org/cached"), "model", ["*.json"]).commit == commit  # the cache answers when the hub cannot


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


# ---------------------------------------------------------------------------------------------
# Which files are a split: the rules of `datasets`, on the commit's file list

def jsonl_rows(prefix: str, n: int) -> str:
    return "".join(f'{{"id": "{prefix}{i}", "problem": "{i}+{i}=", "answer": "{2 * i}"}}\n' for i in range(n))


def test_a_hub_dataset_without_a_configs_header_splits_its_files_by_name(hub_cache):
    """A repo with train.jsonl and test.jsonl and a card without `configs:` trained on both, and its
    `test` split returned the train rows too: each split is now its own files, as `datasets` reads it."""
    commit = put_in_hub_cache(hub_cache, "dataset", "org/plain", {
        "README.md": "# A dataset card with no YAML header\n", "train.jsonl": jsonl_rows("tr", 5),
        "test.jsonl": jsonl_rows("te", 3),
    })
    train = dataset_files(parse_hub_id("org/plain"))
    assert (train.split, [p.name for p in train.files]) == ("train", ["train.jsonl"])
    assert [p.name for p in dataset_files(parse_hub_id("org/plain"), "test").files] == ["test.jsonl"]
    assert {p.meta["hub_split"] for p in load_prompts("org/plain")} == {"train"}
    assert len(load_prompts(f"org/plain@{commit}")) == 5
    with pytest.raises(HubError, match=r"has no split 'validation'; it has \['test', 'train'\]"):
        dataset_files(parse_hub_id("org/plain"), "validation")


@pytest.mark.parametrize("files, splits", [
    # folders named for a split, at any depth
    ({"data/train/a.jsonl": 2, "data/train/b.jsonl": 1, "data/test/c.jsonl": 1},
     {"train": ["data/train/a.jsonl", "data/train/b.jsonl"], "test": ["data/test/c.jsonl"]}),
    # sharded files name their split; a split name that is no keyword is a split too
    ({"data/train-00000-of-00002.jsonl": 1, "data/train-00001-of-00002.jsonl": 1,
      "data/validation-00000-of-00001.jsonl": 1, "data/extra-00000-of-00001.jsonl": 1},
     {"train": ["data/train-00000-of-00002.jsonl", "data/train-00001-of-00002.jsonl"],
      "validation": ["data/validation-00000-of-00001.jsonl"], "extra": ["data/extra-00000-of-00001.jsonl"]}),
    # the other split words (dev, eval) as whole words; `training` is train, `contest` is not test
    ({"my_training.jsonl": 1, "dev.jsonl": 1, "final-eval.jsonl": 1, "contest.jsonl": 1},
     {"train": ["my_training.jsonl"], "validation": ["dev.jsonl"], "test": ["final-eval.jsonl"]}),
    # no split word anywhere: every data file is train; hidden and special folders never are
    ({"problems.jsonl": 1, "more/problems2.jsonl": 1, ".hidden/x.jsonl": 1, "__pycache__/y.jsonl": 1},
     {"train": ["more/problems2.jsonl", "problems.jsonl"]}),
])
def test_split_inference_follows_the_rules_of_datasets(hub_cache, tmp_path, files, splits):
    """Each layout's splits as `datasets` itself infers and resolves them on a folder with the same files
    (get_data_patterns, resolve_pattern), and as a run reads the same files from the hub cache."""
    from datasets.data_files import EmptyDatasetError, get_data_patterns, resolve_pattern

    from ada_core.data import hub_layout

    folder = tmp_path / "repo"
    for rel, rows in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(jsonl_rows(Path(rel).stem, rows))
    theirs = {}
    for split, patterns in get_data_patterns(str(folder)).items():
        found = set()
        for pattern in patterns:
            try:
                found |= {Path(p).relative_to(folder).as_posix() for p in resolve_pattern(pattern, str(folder))}
            except (FileNotFoundError, EmptyDatasetError):
                continue
        theirs[split] = sorted(found)
    assert theirs == splits  # the expectation is what `datasets` does ...
    ours = hub_layout.infer_splits(sorted(files))
    assert {s: hub_layout.split_files("", p, sorted(files)) for s, p in ours.items()} == splits  # ... and ours
    put_in_hub_cache(hub_cache, "dataset", "org/layout", {"README.md": "no header\n", **{
        rel: (folder / rel).read_text() for rel in files}})
    for split, paths in splits.items():
        found = dataset_files(parse_hub_id("org/layout"), split)
        assert [p.relative_to(found.snapshot.path).as_posix() for p in found.files] == paths


def test_a_card_config_is_read_as_datasets_reads_it(hub_cache):
    """`data_dir` without `data_files` infers splits inside it; `data_files` that `datasets` would refuse
    (a mapping) is refused in one line instead of taking every file; a split of another format too."""
    put_in_hub_cache(hub_cache, "dataset", "org/in-dir", {
        "README.md": "---\nconfigs:\n- config_name: main\n  data_dir: v2\n---\n",
        "v1/train.jsonl": jsonl_rows("old", 2), "v2/train.jsonl": jsonl_rows("new", 3), "v2/test.jsonl": jsonl_rows("t", 1),
    })
    found = dataset_files(parse_hub_id("org/in-dir"))
    assert (found.config, [p.relative_to(found.snapshot.path).as_posix() for p in found.files]) == ("main", ["v2/train.jsonl"])
    put_in_hub_cache(hub_cache, "dataset", "org/mapping", {
        "README.md": "---\nconfigs:\n- config_name: default\n  data_files:\n    train: a.jsonl\n    test: b.jsonl\n---\n",
        "a.jsonl": jsonl_rows("a", 1), "b.jsonl": jsonl_rows("b", 1),
    })
    with pytest.raises(HubError, match=r"config 'default': data_files must be a pattern, a list of patterns, or a list "
                                       r"of \{split, path\} entries") as err:
        dataset_files(parse_hub_id("org/mapping"))
    assert "\n" not in str(err.value)
    put_in_hub_cache(hub_cache, "dataset", "org/csv", {"README.md": "x\n", "train.csv": "problem,answer\n1+1=,2\n",
                                                       "train_extra.csv": "problem,answer\n1+2=,3\n", "notes.jsonl": "{}\n"})
    with pytest.raises(HubError, match=r"split 'train': its files are \.csv \(2 of them\)"):
        dataset_files(parse_hub_id("org/csv"))


# ---------------------------------------------------------------------------------------------
# A snapshot is taken whole, by its file list

def two_shard_dataset(hub_cache) -> tuple[str, Path]:
    """A dataset of two train shards; returns (commit, snapshot folder)."""
    commit = put_in_hub_cache(hub_cache, "dataset", "org/shards", {
        "README.md": dataset_card({"train": "data/train-*"}),
        "data/train-00000-of-00002.jsonl": jsonl_rows("a", 4), "data/train-00001-of-00002.jsonl": jsonl_rows("b", 4),
    })
    return commit, hub_cache / "datasets--org--shards" / "snapshots" / commit


def test_a_snapshot_missing_a_shard_is_refused_naming_it(hub_cache, monkeypatch, free_port):
    """A partly downloaded snapshot was taken as the whole pinned dataset (one file was enough): the run
    trained on half of it under the complete run's `org/name@<commit>` and digest."""
    commit, snapshot = two_shard_dataset(hub_cache)
    whole = dataset_files(parse_hub_id(f"org/shards@{commit}"))
    assert len(whole.files) == 2 and len(load_prompts(f"org/shards@{commit}")) == 8
    (snapshot / "data/train-00001-of-00002.jsonl").unlink()
    missing = r"lacks 1 of its files: data/train-00001-of-00002\.jsonl"
    for name in (f"org/shards@{commit}", "org/shards"):
        with pytest.raises(HubError, match=rf"dataset '{name}': the cached snapshot {commit[:12]} {missing}; the hub is "
                                           r"offline \(HF_HUB_OFFLINE=1\); download it where the hub is reachable"):
            load_prompts(name)
    result = CliRunner().invoke(app, ["train", "--steps", "1", "--dataset", f"org/shards@{commit}"])
    assert result.exit_code == INPUT_ERROR_EXIT and "data/train-00001-of-00002.jsonl" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    monkeypatch.delenv("HF_HUB_OFFLINE")  # a hub that cannot be reached cannot complete it either
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    # huggingface_hub retries a refused connection 5 times with backoff (1+2+4+8+8 s for each file it asks
    # for): 46 s of this test's sleeping, in a tier that promises under a minute. Once is enough to be refused.
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "http_backoff", functools.partial(_http.http_backoff, max_retries=0))
    with pytest.raises(HubError, match=rf"{missing}, and the hub could not be reached"):
        dataset_files(parse_hub_id(f"org/shards@{commit}"))
    with pytest.raises(HubError, match=missing):
        dataset_files(parse_hub_id("org/shards"))


def test_a_truncated_file_or_a_snapshot_without_a_file_list_is_refused(hub_cache):
    commit, snapshot = two_shard_dataset(hub_cache)
    shard = snapshot / "data/train-00000-of-00002.jsonl"
    shard.write_text(shard.read_text()[:20])
    with pytest.raises(HubError, match=r"lacks 1 of its files: data/train-00000-of-00002\.jsonl \(20 of \d+ bytes\)"):
        dataset_files(parse_hub_id(f"org/shards@{commit}"))
    model = put_in_hub_cache(hub_cache, "model", "org/m", {"config.json": "{}", "model.safetensors": b"0" * 64})
    (hub_cache / "models--org--m" / "trees" / f"{model}.json").unlink()
    with pytest.raises(HubError, match=rf"model 'org/m': the hub cache has no file list for commit {model} .*trees/{model}"
                                       r"\.json.* so whether the snapshot is whole cannot be checked"):
        resolve(HubRef("org/m"), "model", ["*.json", "*.safetensors"])


def test_a_model_snapshot_missing_its_weights_is_refused(hub_cache):
    commit = put_in_hub_cache(hub_cache, "model", "org/sharded", {
        "config.json": "{}", "model-00001-of-00002.safetensors": b"1" * 8, "model-00002-of-00002.safetensors": b"2" * 8,
        "model.safetensors.index.json": "{}", "tokenizer.json": "{}",
    })
    (hub_cache / "models--org--sharded" / "snapshots" / commit / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(HubError, match=r"lacks 1 of its files: model-00002-of-00002\.safetensors"):
        pin(f"org/sharded@{commit}", "model")


def test_the_digest_covers_the_files_read(hub_cache):
    """The digest was `hub:org/name@commit` whatever was read; it is now over the files read, by their content ids."""
    import hashlib
    import json

    from ada_core.data import data_digest

    commit, _ = two_shard_dataset(hub_cache)
    found = dataset_files(parse_hub_id("org/shards"))
    listing = json.loads((hub_cache / "datasets--org--shards" / "trees" / f"{commit}.json").read_text())["files"]
    for path in ("data/train-00000-of-00002.jsonl", "data/train-00001-of-00002.jsonl"):
        assert f"{path}\x1f{listing[path]['size']}\x1f{listing[path]['blob_id']}" in found.identity
    assert data_digest("org/shards") == data_digest(f"org/shards@{commit}") == hashlib.sha256(
        found.identity.encode()).hexdigest()[:16]
    put_in_hub_cache(hub_cache, "dataset", "org/shards", {  # one shard fewer at the next commit: another digest
        "README.md": dataset_card({"train": "data/train-*"}), "data/train-00000-of-00002.jsonl": jsonl_rows("a", 4)})
    assert data_digest("org/shards") != data_digest(f"org/shards@{commit}")


# ---------------------------------------------------------------------------------------------
# A run named by hub ids resumes as the same run

def test_a_resume_that_names_the_hub_ids_unpinned_continues_at_the_runs_commits(tmp_path):
    """config.yaml records `org/name@<commit>`; the request that resumes gives what started the run
    (`org/name`): that is no change, and the run goes on at its own commits. Another commit or repo is."""
    import yaml

    from ada_core.config import build_config
    from ada_core.errors import ResumeError
    from ada_core.run.resume import resumed_config

    model, data = "org/tiny@" + "a" * 40, "org/arith@" + "b" * 40
    saved = build_config("grpo", "tiny", overrides={"model": model, "data": {"dataset": data}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved.model_dump(), sort_keys=False))
    for asked_model, asked_data in (("org/tiny", "org/arith"), ("org/tiny@main", "org/arith@v1"), (model, data)):
        config = resumed_config(tmp_path, {"model": asked_model, "data": {"dataset": asked_data}, "steps": 9})
        assert (config.model, config.data.dataset, config.steps) == (model, data, 9)
    with pytest.raises(ResumeError, match=r"model: org/tiny@a{40} -> org/tiny@c{40}"):
        resumed_config(tmp_path, {"model": "org/tiny@" + "c" * 40})
    with pytest.raises(ResumeError, match=r"data\.dataset: org/arith@b{40} -> org/other"):
        resumed_config(tmp_path, {"data": {"dataset": "org/other"}})
