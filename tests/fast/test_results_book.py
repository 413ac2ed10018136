"""The results book says what its numbers say: every ordering and every claim verdict in the testbed pages is
written from the committed saved runs (report/claims.py), and these tests write them again and compare."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from report.claims import BEGIN, END, PAPER_NAMES, blocks_in, book_blocks, interval, relation, sentence

ROOT = Path(__file__).resolve().parents[2]
BOOK = [ROOT / "docs" / "benchmarks" / "testbed.md", ROOT / "docs" / "BENCHMARKS.md"]


def test_above_and_below_only_where_the_interval_excludes_zero():
    assert relation(0.013, 0.006) == "above"
    assert relation(-0.013, 0.006) == "below"
    assert relation(0.005, 0.006) == "tie"  # n16 - DAPO +0.005 [-0.001, +0.011] is a tie
    assert relation(0.01, math.nan) == "tie"  # one seed: no interval, no ordering
    text = sentence({"a": "grpo-n16", "b": "dapo", "mean": 0.005, "half": 0.006, "seeds": [0, 1, 2, 3, 4], "step": 100})
    assert text == "GRPO n = 16 ties with DAPO: +0.005 [-0.001, +0.011] (seeds 0,1,2,3,4, step 100)"
    assert interval(0.0031, 0.0029) == "+0.003 [+0.0002, +0.006]"  # a bound that rounds to 0 keeps its sign


@pytest.mark.parametrize("page", BOOK, ids=lambda p: p.name)
def test_every_generated_block_of_the_book_is_what_the_saved_runs_give(page):
    text = page.read_text()
    for name, files, body in blocks_in(text):
        assert files, f"{page.name}: block {name} names no saved-runs file"
        expected = book_blocks([ROOT / f for f in files], list(PAPER_NAMES))[name]
        assert body == expected, (f"{page.name}: block {name} is not what {files} give: run "
                                  f"`.venv/bin/python -m report.claims {' '.join(files)}` and paste its block")


def test_the_testbed_page_has_its_generated_orderings_and_claims():
    blocks = blocks_in(BOOK[0].read_text())
    assert {"orderings", "claims"} <= {name for name, _, _ in blocks}
    assert BEGIN.startswith("<!-- claims:begin") and END == "<!-- claims:end -->"
