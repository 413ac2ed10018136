"""Prompt generators, dataset-file loaders (fixtures in tests/fixtures) and the train/eval split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ada_core.data import (
    REASONING_GYM_TASKS,
    detect_schema,
    generate_prompts,
    load_dataset_file,
    load_prompts,
    reasoning_gym_levels,
    split_prompts,
)
from ada_core.records import Prompt

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


# --- generators ------------------------------------------------------------------------------


def test_arithmetic_prompts_are_correct_distinct_and_seeded():
    prompts = generate_prompts("arithmetic", 500, seed=3)
    assert prompts == generate_prompts("arithmetic", 500, seed=3)
    assert [p.text for p in prompts] != [p.text for p in generate_prompts("arithmetic", 500, seed=4)]
    assert len({p.text for p in prompts}) == 500 and len({p.id for p in prompts}) == 500
    for p in prompts:
        a, b = p.text.removesuffix("=").split("+")
        assert p.text.endswith("=") and p.answer == str(int(a) + int(b))
        assert p.difficulty == max(len(a), len(b)) and 1 <= p.difficulty <= 3
        assert len(p.answer) <= 4  # + eos: answers of at most 5 tokens
        assert p.meta["answer_format"] == "plain" and p.source == "arithmetic"
    assert {p.difficulty for p in prompts} == {1.0, 2.0, 3.0}


def test_arithmetic_difficulty_caps_operand_digits():
    prompts = generate_prompts("arithmetic", 60, seed=0, difficulty=1)
    assert all(len(p.text) == 4 for p in prompts)  # `a+b=` with one-digit operands
    with pytest.raises(ValueError, match="only 100 distinct"):
        generate_prompts("arithmetic", 101, seed=0, difficulty=1)
    with pytest.raises(ValueError, match="1..6"):
        generate_prompts("arithmetic", 5, seed=0, difficulty=0)


@pytest.mark.parametrize("task", REASONING_GYM_TASKS)
def test_reasoning_gym_tasks_at_easiest_and_hardest_level(task):
    top = reasoning_gym_levels(task)
    for level in (0, top):
        prompts = generate_prompts(task, 4, seed=1, difficulty=level)
        assert prompts == generate_prompts(f"reasoning_gym/{task}", 4, seed=1, difficulty=level)
        assert len({p.id for p in prompts}) == 4 and len({p.text for p in prompts}) == 4
        for p in prompts:
            assert p.text and p.answer and p.difficulty == float(level)
            assert p.source == f"reasoning_gym/{task}" and p.meta["answer_format"] == "boxed"
    with pytest.raises(ValueError, match=f"0..{top}"):
        generate_prompts(task, 2, seed=0, difficulty=top + 1)


def test_harder_level_means_bigger_numbers():
    easy = generate_prompts("chain_sum", 30, seed=0, difficulty=0)
    hard = generate_prompts("chain_sum", 30, seed=0, difficulty=5)
    assert max(abs(int(p.answer)) for p in easy) < 100
    assert max(abs(int(p.answer)) for p in hard) > 1000


def test_unknown_generator_names_the_choices():
    with pytest.raises(ValueError, match="unknown generator 'sudoku'.*arithmetic"):
        generate_prompts("sudoku", 3, seed=0)


# --- loaders ---------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_openr1(suffix):
    prompts = load_dataset_file(FIXTURES / f"openr1.{suffix}")
    assert [p.answer for p in prompts] == ["28", "4", "\\frac{5}{6}"]
    assert prompts[0].id == "openr1/5b1c7a1e-0001" and prompts[0].source == "openr1"
    assert prompts[0].meta == {"answer_format": "boxed", "file": f"openr1.{suffix}", "problem_type": "Number Theory",
                               "question_type": "math-word-problem", "source": "olympiads"}
    assert prompts[2].text == "What is $\\frac{1}{2} + \\frac{1}{3}$?"


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_math500(suffix):
    prompts = load_dataset_file(FIXTURES / f"math500.{suffix}")
    assert [p.id for p in prompts] == ["math500/test/precalculus/807.json", "math500/test/algebra/2036.json",
                                       "math500/test/number_theory/572.json"]
    assert [p.difficulty for p in prompts] == [2.0, 1.0, 3.0]
    assert prompts[1].answer == "26000" and prompts[1].meta["subject"] == "Algebra"


def test_minerva_both_layouts():
    prompts = load_dataset_file(FIXTURES / "minerva.jsonl")
    assert [p.answer for p in prompts] == ["1.6", "-54.4"] and prompts[0].text.startswith("Each of the two")
    assert prompts[1].id == "minerva/1" and prompts[1].source == "minerva"
    boxed = load_dataset_file(FIXTURES / "minerva_boxed.jsonl")
    assert [p.answer for p in boxed] == ["1", "4"]  # the LAST \boxed{} of the solution


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_olympiadbench_answer_lists(suffix):
    prompts = load_dataset_file(FIXTURES / f"olympiadbench.{suffix}")
    assert [p.answer for p in prompts] == ["9", "$-2$, $2$"]
    assert prompts[1].meta["is_multiple_answer"] is True and prompts[0].id == "olympiadbench/2231"


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_aime_integer_answers(suffix):
    prompts = load_dataset_file(FIXTURES / f"aime.{suffix}")
    assert [p.answer for p in prompts] == ["24", "14"] and [p.id for p in prompts] == ["aime/60", "aime/61"]
    assert prompts[0].meta["year"] == "2024"


def test_detect_schema_and_override(tmp_path):
    assert detect_schema({"problem", "answer", "id"}) == "aime"
    assert detect_schema({"question", "final_answer"}) == "olympiadbench"
    with pytest.raises(ValueError, match=r"cannot tell.*\['prompt', 'response'\].*schema="):
        detect_schema({"prompt", "response"})
    # A MATH500 file read as AIME keeps its rows but not MATH500's ids.
    prompts = load_dataset_file(FIXTURES / "math500.jsonl", schema="aime")
    assert prompts[0].id == "math500/1" and prompts[0].source == "aime"
    with pytest.raises(ValueError, match="unknown schema 'gsm8k'"):
        load_dataset_file(FIXTURES / "math500.jsonl", schema="gsm8k")


def _jsonl(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"problem": "1+1?", "answer": "2", "id": 1}


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ({"problem": "2+2?", "id": 2}, "row 2: field 'answer' is missing"),
        ({"problem": "   ", "answer": "4", "id": 2}, "row 2: field 'problem' is empty"),
        ({"problem": "2+2?", "answer": "", "id": 2}, "row 2: field 'answer' is empty"),
        ({"problem": ["2+2?"], "answer": "4", "id": 2}, "row 2: field 'problem' must be a string, got list"),
        ({"problem": "2+2?", "answer": 4.5, "id": 2}, "row 2: field 'answer' must be a string, got float"),
        ({"problem": "2+2?", "answer": "4", "id": 1}, "row 2: field 'id' repeats id 1 of row 1"),
        ({"problem": "2+2?", "answer": "4", "id": {"a": 1}}, "row 2: field 'id' must be a string or integer"),
        ("{not json", "row 2: not valid JSON"),
        ("[1, 2]", "row 2: expected a JSON object, got list"),
    ],
)
def test_malformed_jsonl_rows_name_file_row_and_field(tmp_path, bad_row, message):
    path = _jsonl(tmp_path, [GOOD, bad_row])
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        load_dataset_file(path, schema="aime")


def test_malformed_parquet_row_and_list_answers(tmp_path):
    path = tmp_path / "olymp.parquet"
    rows = [{"id": 1, "question": "q1", "final_answer": ["1"]}, {"id": 2, "question": "q2", "final_answer": ["2"]},
            {"id": 3, "question": "q3", "final_answer": None}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"olymp\.parquet: row 3: field 'final_answer' is missing"):
        load_dataset_file(path)
    rows[2]["final_answer"] = []
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match="row 3: field 'final_answer' is an empty list"):
        load_dataset_file(path)


def test_missing_boxed_in_solution_only_file(tmp_path):
    path = _jsonl(tmp_path, [{"problem": "p", "solution": "no box here", "idx": 0}])
    with pytest.raises(ValueError, match=r"row 1: field 'solution' has no \\boxed\{\}"):
        load_dataset_file(path)


def test_missing_file_and_unsupported_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_dataset_file(tmp_path / "nope.jsonl")
    (tmp_path / "data.csv").write_text("problem,answer\n")
    with pytest.raises(ValueError, match=r"unsupported file type '\.csv'"):
        load_dataset_file(tmp_path / "data.csv")


# --- dispatch and split ----------------------------------------------------------------------


def test_load_prompts_dispatches_generators_levels_and_files(tmp_path):
    assert load_prompts("arithmetic", 10, seed=2) == generate_prompts("arithmetic", 10, seed=2)
    leveled = load_prompts("chain_sum:2", 5, seed=0)
    assert all(p.difficulty == 2.0 for p in leveled)
    assert len(load_prompts(str(FIXTURES / "math500.parquet"))) == 3
    sample = load_prompts(str(FIXTURES / "openr1.jsonl"), size=2, seed=7)
    assert sample == load_prompts(str(FIXTURES / "openr1.jsonl"), size=2, seed=7) and len(sample) == 2
    all_ids = [p.id for p in load_dataset_file(FIXTURES / "openr1.jsonl")]
    assert [p.id for p in sample] == [i for i in all_ids if i in {p.id for p in sample}]  # file order kept
    with pytest.raises(ValueError, match="not a generator"):
        load_prompts("no_such_dataset", 5, seed=0)
    with pytest.raises(ValueError, match="give a size"):
        load_prompts("arithmetic", None, seed=0)


def test_saved_prompt_records_round_trip(tmp_path):
    prompts = generate_prompts("arithmetic", 5, seed=0)
    prompts[0].difficulty, prompts[0].meta["pass_rate"] = 0.25, 0.25
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "prompts.jsonl").write_text("".join(
        json.dumps({"id": p.id, "text": p.text, "answer": p.answer, "source": p.source,
                    "difficulty": p.difficulty, "meta": p.meta}) + "\n" for p in prompts))
    assert load_prompts(str(folder)) == prompts  # a folder reads its prompts.jsonl


def test_split_is_disjoint_seeded_and_complete():
    prompts = generate_prompts("arithmetic", 100, seed=0)
    train, evals = split_prompts(prompts, eval_size=20, seed=5)
    assert len(train) == 80 and len(evals) == 20
    assert not {p.id for p in train} & {p.id for p in evals}
    assert sorted(p.id for p in train + evals) == sorted(p.id for p in prompts)
    assert (train, evals) == split_prompts(prompts, eval_size=20, seed=5)
    assert evals != split_prompts(prompts, eval_size=20, seed=6)[1]
    with pytest.raises(ValueError, match=r"eval_size must be in \[0, 100\)"):
        split_prompts(prompts, eval_size=100, seed=0)
    with pytest.raises(ValueError, match="appears more than once"):
        split_prompts(prompts + prompts[:1], eval_size=2, seed=0)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), data=st.data())
def test_split_property(n, data):
    eval_size = data.draw(st.integers(0, n - 1))
    prompts = [Prompt(id=f"p{i}", text=f"{i}+1=", answer=str(i + 1)) for i in range(n)]
    train, evals = split_prompts(prompts, eval_size, seed=data.draw(st.integers(0, 10**6)))
    assert len(evals) == eval_size and len(train) + len(evals) == n
    assert {p.id for p in train}.isdisjoint(p.id for p in evals)
    assert [p.id for p in train] == sorted((p.id for p in train), key=lambda i: int(i[1:]))  # input order


def test_digests_follow_contents_and_key_the_curation_cache(tmp_path):
    from ada_core.config import build_config
    from ada_core.data import data_digest, prompts_digest
    from tasks.curation import curation_inputs, curation_key

    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "answer": "2", "id": 1}) + "\n")
    config = build_config("grpo", "tiny", overrides={"data": {"dataset": str(path)}})
    first = curation_inputs(config, 0)
    assert first["dataset_digest"] == data_digest(str(path)) == data_digest(str(path))
    path.write_text(json.dumps({"problem": "1+1?", "answer": "3", "id": 1}) + "\n")  # edited in place
    second = curation_inputs(config, 0)
    assert second["dataset_digest"] != first["dataset_digest"]
    assert curation_key({k: v for k, v in second.items() if k not in ("micro_batch_size", "home")}) != curation_key(
        {k: v for k, v in first.items() if k not in ("micro_batch_size", "home")})
    assert data_digest("arithmetic") != data_digest("chain_sum")
    prompts = load_dataset_file(path)
    assert prompts_digest(prompts) == prompts_digest(list(prompts)) != prompts_digest(prompts[:0])
