"""The flows' parameter models, group grids and failure summaries, validated without running a flow."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ada_core.config import ConfigError
from flows.params import CompareParams, SweepParams, TrainParams, nest_dotted


def test_parameter_models_validate_fields():
    with pytest.raises(ValidationError, match="steps"):
        TrainParams(steps=0)
    with pytest.raises(ValidationError, match="preset"):
        TrainParams(preset="ppo")
    with pytest.raises(ValidationError, match="variants"):
        CompareParams(variants=["grpo", "grpo"], matched_grpo=False)
    assert TrainParams(preset="ada-pos", seed=3, steps=7).config().sampler.exit_rule == "pos"
    assert TrainParams(overrides={"sampler": {"M": 2}, "sampler.N": 3}).config().sampler.model_dump()["M"] == 2


def test_nest_dotted_merges_dotted_and_nested_keys():
    assert nest_dotted({"sampler.M": 8, "sampler": {"N": 2}, "steps": 3}) == {"sampler": {"M": 8, "N": 2}, "steps": 3}
    with pytest.raises(ConfigError, match="steps"):
        nest_dotted({"steps": 3, "steps.x": 1})


def test_sweep_grid_skips_rounds_for_fixed_samplers():
    grid = SweepParams(variants=["ada-pos", "dapo"], N=[2, 4], M=[8], n=[4, 8]).grid()
    assert [label for _, label, _ in grid] == [
        "ada-pos-N2-M8-n4", "ada-pos-N2-M8-n8", "ada-pos-N4-M8-n4", "ada-pos-N4-M8-n8", "dapo-n4", "dapo-n8"]


def test_group_parameters_document_and_validate_fan_out():
    assert CompareParams().children == "inline" and SweepParams().children == "inline"  # the embedded default
    assert CompareParams().concurrency_limit == "ada-train" and CompareParams().max_parallel is None
    for field in ("children", "max_parallel", "concurrency_limit", "deployment", "poll_s"):
        assert CompareParams.model_fields[field].description, field
    with pytest.raises(ValueError, match="children"):
        CompareParams(children="ray")
    with pytest.raises(ValueError, match="max_parallel"):
        SweepParams(max_parallel=0)
    with pytest.raises(ValueError, match="concurrency_limit"):
        CompareParams(concurrency_limit="gpu/0")  # Prefect refuses '/' in a limit's name


def test_failures_markdown_links_the_flow_run():
    from flows.group import failures_markdown

    assert failures_markdown([]) == ""
    text = failures_markdown([{"variant": "ada-balance", "seed": 1, "state": "CRASHED", "flow_run_id": "abc",
                               "flow_run_url": "http://127.0.0.1:4200/runs/flow-run/abc", "message": "worker\nlost"},
                              {"variant": "grpo-matched", "seed": 1, "state": "NOT_RUN", "flow_run_id": None,
                               "flow_run_url": None, "message": "its reference ada-balance-s1 failed"}])
    assert "## Failed children (2)" in text
    assert "`ada-balance` seed 1: **CRASHED**, [flow run abc](http://127.0.0.1:4200/runs/flow-run/abc): worker lost" in text
    assert "`grpo-matched` seed 1: **NOT_RUN**, no flow run: its reference ada-balance-s1 failed" in text


def test_forms_show_the_defaults_and_keep_angle_brackets():
    """Prefect's form fills a field from its schema's `default`: a `default_factory` has none, so the
    compare form showed "0 selected" variants while a run used three. And it renders descriptions
    as markdown, where a bare `<variant>` is an HTML tag and vanishes: such text goes in backticks."""
    import re

    from flows.params import CurateParams, EvaluateParams

    for cls in (TrainParams, CompareParams, SweepParams, EvaluateParams, CurateParams):
        schema = cls.model_json_schema()
        instance = cls()
        for name, field in cls.model_fields.items():
            assert schema["properties"][name].get("default") == instance.model_dump(mode="json")[name], (cls, name)
            assert "<" not in re.sub(r"`[^`]*`", "", field.description or ""), (cls.__name__, name)
    compare = CompareParams.model_json_schema()["properties"]
    assert compare["variants"]["default"] == ["grpo", "ada-pos", "ada-balance"] and compare["seeds"]["default"] == [0]
    assert compare["regimes"]["default"] == ["default"] and compare["matched_grpo"]["default"] is True
    assert compare["curate"]["default"] is True
    a, b = CompareParams(), CompareParams()  # a literal list default is still one list per instance
    a.variants.append("dapo")
    assert b.variants == ["grpo", "ada-pos", "ada-balance"]
