"""Curation's pure stages (text normalisation, dedup) and its atomic save, with no model."""

from __future__ import annotations

import os

import pytest

from ada_core import paths
from ada_core.data.curation import CurationResult, dedup, normalise_text, save_curated
from ada_core.records import Prompt


def test_normalise_text_ignores_case_spacing_and_latex_spacing():
    base = normalise_text(r"Find $(\frac{1}{2} + x)$ if x = 3.")
    for variant in (r"find  $(\frac{1}{2}+x)$  if X=3.", r"FIND $(\dfrac{1}{2}\,+\;x)$ if x = 3.",
                    "Find $\\left( \\frac{1}{2} \\quad + x\\right)$\nif x=3."):
        assert normalise_text(variant) == base
    assert normalise_text("2 3+1=") != normalise_text("23+1=")  # digits apart stay apart
    assert normalise_text("Find x+1.") != normalise_text("Find x+2.")


def test_dedup_keeps_first_and_maps_duplicates():
    prompts = [Prompt(id="a", text="What is $x + 1$?", answer="1"), Prompt(id="b", text="what is $x+1$ ?", answer="1"),
               Prompt(id="c", text="What is $x + 2$?", answer="2"), Prompt(id="d", text="WHAT IS $X\\,+\\,1$?", answer="1")]
    kept, stage = dedup(prompts)
    assert [p.id for p in kept] == ["a", "c"]
    assert stage["duplicate_of"] == {"b": "a", "d": "a"}
    assert stage["dropped"]["duplicate"] == {"count": 2, "ids": ["b", "d"]}


def test_failed_save_keeps_the_previous_set(tmp_path, monkeypatch):
    old = CurationResult([Prompt(id="a", text="1+1=", answer="2")], {"input": 1, "kept": 1})
    save_curated(old, tmp_path)
    before = (tmp_path / "prompts.jsonl").read_text()
    new = CurationResult([Prompt(id="b", text="2+2=", answer="4")], {"input": 1, "kept": 1})

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(paths.os, "replace", fail)  # save_curated writes through paths.write_atomic
    with pytest.raises(OSError, match="disk full"):
        save_curated(new, tmp_path)
    assert (tmp_path / "prompts.jsonl").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["dataset", "prompts.jsonl", "report.json"]
