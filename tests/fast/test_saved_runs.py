"""Saved runs (report/saved_runs.py, `benchmarks/paper_tables.py --save-runs` / `--tables-from-runs`): a grid's
finished runs in a small file, the same tables from it on any machine, and no tables from runs whose starts differ."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from ada_core import metrics as K
from ada_core.run.files import CONFIG, METRICS
from report.curves import load_run
from report.paper_tables import paper_tables_markdown
from report.saved_runs import POINT_KEYS, RefusedRuns, machine, read_runs, write_runs
from test_paper_tables import pool, run

ROOT = Path(__file__).resolve().parents[2]
START = {"start_model_sha256": "a" * 64, "dataset_hash": "c0ffee0000000001", "heldout_digest": "e0e0e0e0e0e0e0e1",
         "mlflow_run_id": "r1", "ran": "2026-12-04T01:00:00Z"}
HOST = {"cpu": "Test CPU", "avx512": True}
SAVED = "2026-12-04T02:00:00Z"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("paper_tables_benchmark", ROOT / "benchmarks" / "paper_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs_by_pool() -> dict:
    """Both pools, with a config (the tables' caption reads eval_k) and a metric no table reads."""
    out = {"standard": pool(), "hard": pool()[:3] + [run("grpo-n8", 0, [0.1, 0.2], 256, 2.0, planned=2)]}
    for runs in out.values():
        for r in runs:
            r.config = {"eval_k": 8, "steps": 2, **r.config}
            for p in r.points:
                p["loss/policy"] = 0.5
    return out


def starts_for(runs: dict, **by_pool: dict) -> dict:
    """Every run's start: START, with a pool's values replaced by `by_pool[pool]`."""
    return {str(r.run_dir): {**START, **by_pool.get(p, {})} for p, rs in runs.items() for r in rs}


def save(path: Path, runs: dict, **by_pool: dict) -> Path:
    """Hand-made runs share `Path('.')` as run_dir, so each pool is written with its own starts."""
    records = []
    for p, rs in runs.items():
        part = path.with_suffix(f".{p}.part")
        write_runs(part, {p: rs}, starts_for({p: rs}, **by_pool), host=HOST, saved=SAVED)
        records.append(part.read_text())
        part.unlink()
    path.write_text("".join(records))
    return path


def tables_from(bench, tmp_path: Path, *files: Path, out: str = "out"):
    return bench.main(["--tables-from-runs", *map(str, files), "--out", str(tmp_path / out)])


def test_saved_runs_give_the_same_tables_as_the_runs_themselves(bench, tmp_path):
    runs = runs_by_pool()
    path = save(tmp_path / "runs.jsonl", runs)
    result = tables_from(bench, tmp_path, path)
    body = paper_tables_markdown(runs, order=bench.PAPER_METHODS)
    assert result["markdown"].endswith("\n\n" + body)
    assert (tmp_path / "out" / "paper_tables.md").read_text() == result["markdown"]
    header = result["markdown"].split("\n\n")[1]
    assert f"- pool `standard`: 6 runs read from {path} (held-out digest e0e0e0e0e0e0e0e1, curated set " \
           "c0ffee0000000001): grpo-s0, grpo-s1, grpo-s2, grpo-n8-s0, grpo-n8-s1, grpo-n8-s2" in header
    assert f"`start_model_sha256` {'a' * 64}; saved on Test CPU (AVX-512), 2026-12-04" in header
    assert "k = 8" in body and "stopped at step 1 of 2" in body  # the config and the short run came back
    # only what the tables read is kept: one line a run, the metric no table reads dropped
    lines = path.read_text().splitlines()
    assert len(lines) == 10
    record = json.loads(lines[0])
    assert set(record["points"]) <= set(POINT_KEYS) and "loss/policy" not in record["points"]
    assert record["start"] == START and record["machine"] == HOST and record["saved"] == SAVED


def test_a_grid_saved_over_two_sessions_gives_the_tables_of_the_whole(bench, tmp_path):
    runs = runs_by_pool()
    first = {p: [r for r in rs if r.seed < 2] for p, rs in runs.items()}
    second = {p: [r for r in rs if r.seed == 2] for p, rs in runs.items() if any(r.seed == 2 for r in rs)}
    files = save(tmp_path / "s01.jsonl", first), save(tmp_path / "s2.jsonl", second)
    whole = tables_from(bench, tmp_path, *files)["markdown"]
    assert whole.endswith("\n\n" + paper_tables_markdown(runs, order=bench.PAPER_METHODS))
    assert f"runs read from {files[0]}, {files[1]}" in whole
    # and --save-runs merges them into one file that reads back the same
    merged = tmp_path / "merged.jsonl"
    bench.main(["--tables-from-runs", *map(str, files), "--save-runs", str(merged), "--out", str(tmp_path / "m")])
    again = tables_from(bench, tmp_path, merged, out="again")["markdown"]
    assert again.split("\n\n", 2)[2] == whole.split("\n\n", 2)[2]


def test_runs_loaded_from_folders_read_back_without_their_folders(bench, tmp_path):
    # a run folder as a run writes it; once saved, the tables never read the folder (here: removed)
    folder = tmp_path / "grpo-s0"
    folder.mkdir()
    source = pool()[0]
    rows = [{k: v for k, v in p.items()} for p in source.points]
    (folder / METRICS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / CONFIG).write_text(yaml.safe_dump({"eval_k": 4, "steps": 2, "seed": 0}))
    loaded = {"standard": [load_run(folder, label="grpo", seed=0)]}
    expected = paper_tables_markdown(loaded, order=bench.PAPER_METHODS)
    path = tmp_path / "runs.jsonl"
    write_runs(path, loaded, {str(folder): START}, host=HOST, saved=SAVED)
    (folder / CONFIG).unlink()
    (folder / METRICS).unlink()
    assert "k = 4" in expected
    assert tables_from(bench, tmp_path, path)["markdown"].endswith("\n\n" + expected)
    back, _ = read_runs([path])
    assert [p["step"] for p in back["standard"][0].points] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("pool_name, key, value, where", [
    ("hard", "start_model_sha256", "b" * 64, "every pool"),  # another warm start: never, in any pool
    ("standard", "heldout_digest", "f0f0f0f0f0f0f0f0", "pool standard"),  # another exam in the same pool
    ("standard", "dataset_hash", "0ddba11000000000", "pool standard"),  # another curated set in the same pool
])
def test_runs_of_another_start_are_refused_in_one_line_naming_the_file(bench, tmp_path, capsys, pool_name, key,
                                                                       value, where):
    runs = runs_by_pool()
    first = save(tmp_path / "first.jsonl", {p: [r for r in rs if r.seed < 2] for p, rs in runs.items()})
    later = save(tmp_path / "later.jsonl", {pool_name: [r for r in runs[pool_name] if r.seed == 2]},
                 **{pool_name: {key: value}})
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        tables_from(bench, tmp_path, first, later)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"paper_tables: refused: {later}:1: pool {pool_name}, grpo seed 2")
    assert f"has {key} {value}, but {first}:1 " in err and f"has {START[key]}" in err and where in err
    assert not (tmp_path / "out").exists()  # nothing written


def test_runs_whose_updates_read_prompts_differently_are_combined(bench, tmp_path):
    """A run saved before `optim.share_prompts` (no such field: one read per row) and one with it on: the same
    start and exam, only the float rounding differs (as between two CPUs), so they are combined."""
    runs = runs_by_pool()
    first = save(tmp_path / "first.jsonl", {p: [r for r in rs if r.seed < 2] for p, rs in runs.items()})
    later = save(tmp_path / "later.jsonl", {"standard": [r for r in runs["standard"] if r.seed == 2]})
    records = [json.loads(line) for line in later.read_text().splitlines()]
    for record in records:
        record["config"].setdefault("optim", {})["share_prompts"] = True
    later.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert tables_from(bench, tmp_path, first, later)["markdown"]


def test_pools_differ_in_their_curated_and_held_out_sets_by_design(bench, tmp_path):
    runs = runs_by_pool()
    path = save(tmp_path / "runs.jsonl", runs, hard={"heldout_digest": "0101010101010101", "dataset_hash": "02"})
    assert tables_from(bench, tmp_path, path)["markdown"].endswith(
        "\n\n" + paper_tables_markdown(runs, order=bench.PAPER_METHODS))


def test_the_same_run_twice_is_refused(bench, tmp_path, capsys):
    path = save(tmp_path / "runs.jsonl", runs_by_pool())
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        tables_from(bench, tmp_path, path, path)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"paper_tables: refused: {path}:1: pool standard, grpo seed 0 is there twice (also in {path}:1): " \
                  "refused, not combined\n"
    assert not (tmp_path / "out").exists()


def test_a_run_duplicated_within_a_file_is_refused_naming_both_lines(bench, tmp_path, capsys):
    """A file edited by hand, its first run pasted again at the end: the refusal names the two lines."""
    path = save(tmp_path / "runs.jsonl", runs_by_pool())
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines) + lines[0])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        tables_from(bench, tmp_path, path)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == (f"paper_tables: refused: {path}:{len(lines) + 1}: pool standard, grpo seed 0 is there twice "
                   f"(also in {path}:1): refused, not combined\n")


def test_a_run_without_a_recorded_start_is_refused(bench, tmp_path, capsys):
    # its MLflow run could not be read: refused when saving, and in a file edited by hand, when reading
    with pytest.raises(RefusedRuns, match="grpo seed 0 records no start_model_sha256"):
        save(tmp_path / "runs.jsonl", {"standard": pool()}, standard={"start_model_sha256": None})
    path = save(tmp_path / "runs.jsonl", {"standard": pool()})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["start"]["start_model_sha256"] = None
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        tables_from(bench, tmp_path, path)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"paper_tables: refused: {path}:1: pool standard, grpo seed 0 records no "
                                       "start_model_sha256: its start cannot be matched, so it is not combined\n")


def test_a_missing_file_is_one_line(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tables_from(bench, tmp_path, tmp_path / "nothing.jsonl")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"paper_tables: refused: {tmp_path / 'nothing.jsonl'}: No such file or directory\n"


def test_machine_reads_the_cpu_model_and_avx512(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2\n")
    assert machine(info) == {"cpu": "AMD EPYC 7B13", "avx512": False, "vector": ""}
    info.write_text("model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: avx2 avx512f amx_tile avx512dq\n")
    assert machine(info) == {"cpu": "Intel(R) Xeon(R) CPU @ 2.20GHz", "avx512": True,
                             "vector": "amx_tile avx512dq avx512f"}
    assert machine(tmp_path / "none") == {"cpu": None, "avx512": None, "vector": None}
    assert K.EVAL_AVG_AT_K in POINT_KEYS


def fake_group(root: Path, uri: str, start_of: dict) -> Path:
    """A compare group folder as the flows leave it: per child metrics.jsonl, config.yaml, run_info.json naming
    its MLflow run, result.json (finished), and that MLflow run with the start the train flow logs."""
    from mlflow import MlflowClient
    from mlflow.entities import Dataset, DatasetInput, InputTag

    client = MlflowClient(uri)
    experiment = client.create_experiment(f"paper-tables-{root.name}")
    group = root / "compare-group"
    for source in pool():
        child = group / f"{source.label}-s{source.seed}"
        child.mkdir(parents=True)
        (child / METRICS).write_text("".join(json.dumps(p) + "\n" for p in source.points))
        (child / CONFIG).write_text(yaml.safe_dump({"eval_k": 8, "steps": 2, "seed": source.seed}))
        run_id = client.create_run(experiment).info.run_id
        start = start_of(source.label, source.seed)
        client.log_param(run_id, "start_model_sha256", start["start_model_sha256"])
        client.log_param(run_id, "dataset_hash", start["dataset_hash"])
        client.log_inputs(run_id, datasets=[DatasetInput(
            Dataset(f"curated:{context}", digest, "code", "{}"), tags=[InputTag("mlflow.data.context", context)])
            for context, digest in (("training", "7777777777777777"), ("evaluation", start["heldout_digest"]))])
        (child / "run_info.json").write_text(json.dumps({"label": source.label, "seed": source.seed,
                                                         "mlflow_run_id": run_id, "tracking_uri": uri}))
        (child / "result.json").write_text(json.dumps({"variant": source.label, "seed": source.seed, "metrics": {}}))
    return group


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy's, from MLflow's store
def test_save_runs_from_run_folders_reads_each_start_from_mlflow(bench, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    group = fake_group(tmp_path, uri, lambda label, seed: START)
    saved = tmp_path / "runs.jsonl"
    direct = bench.run(bench.parse_args(["--tables-from", f"standard={group}", "--save-runs", str(saved),
                                         "--out", str(tmp_path / "direct")]))
    records = [json.loads(line) for line in saved.read_text().splitlines()]
    assert [(r["label"], r["seed"]) for r in records] == [("grpo", s) for s in range(3)] + [("grpo-n8", s) for s in
                                                                                           range(3)]
    start = records[0]["start"]
    assert {k: start[k] for k in ("start_model_sha256", "dataset_hash", "heldout_digest")} == {
        k: START[k] for k in ("start_model_sha256", "dataset_hash", "heldout_digest")}
    assert start["mlflow_run_id"] and start["ran"].endswith("Z") and set(records[0]["machine"]) == {"cpu", "avx512", "vector"}
    again = tables_from(bench, tmp_path, saved, out="again")["markdown"]
    assert again.split("\n\n", 2)[2] == direct["markdown"].split("\n\n", 2)[2]  # the tables, past each header

    # runs whose MLflow runs logged another warm start: refused before anything is written
    other = tmp_path / "other"
    other.mkdir()
    group = fake_group(other, uri, lambda label, seed: {**START, "start_model_sha256": "b" * 64} if seed == 2 else START)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        bench.run(bench.parse_args(["--tables-from", f"standard={group}", "--save-runs", str(other / "runs.jsonl"),
                                    "--out", str(other / "out")]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"paper_tables: refused: {group / 'grpo-s2'}: pool standard, grpo "
                                                    f"seed 2 has start_model_sha256 {'b' * 64}, but {group / 'grpo-s0'} ")
    assert not (other / "runs.jsonl").exists() and not (other / "out" / "paper_tables.md").exists()


def test_the_grid_of_seven_methods_leaves_out_the_controls_only_when_asked(bench):
    """`--no-controls` runs the 7 methods alone (the grid measured for speed, docs/benchmarks/testbed.md); by
    default every adaptive method gets its budget-matched controls."""
    from flows.params import PaperTablesParams

    full = PaperTablesParams(**bench.grid(bench.parse_args(["--pools", "standard"])))
    seven = PaperTablesParams(**bench.grid(bench.parse_args(["--pools", "standard", "--no-controls"])))
    assert full.controls and not seven.controls
    assert full.model_dump(exclude={"controls"}) == seven.model_dump(exclude={"controls"})
