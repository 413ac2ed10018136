"""The flows' parameter models, group grids and failure summaries, validated without running a flow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from ada_core.config import ConfigError
from flows.params import (
    CompareParams,
    CurateParams,
    SweepParams,
    TrainParams,
    nest_dotted,
)


def test_parameter_models_validate_fields():
    with pytest.raises(ValidationError, match="steps"):
        TrainParams(steps=0)
    with pytest.raises(ValidationError, match="preset"):
        TrainParams(preset="ppo")
    with pytest.raises(ValidationError, match="variants"):
        CompareParams(variants=["grpo", "grpo"], matched_grpo=False)
    assert TrainParams(preset="ada-pos", seed=3, steps=7).config().sampler.exit_rule == "pos"
    assert TrainParams(overrides={"sampler": {"M": 2}, "sampler.N": 3}).config().sampler.model_dump()["M"] == 2


def test_a_compare_reference_must_be_one_of_its_runs():
    """The report pairs every run against `reference` by label (Table C); one no child carries left it empty."""
    with pytest.raises(ValidationError, match=r"reference: 'grpo' is not one of the runs \['ada-pos', 'ada-balance', "
                                              r"'grpo-matched'\]"):
        CompareParams(variants=["ada-pos", "ada-balance"], matched_grpo=True)
    with pytest.raises(ValidationError, match="reference: 'grpo-matched'"):
        CompareParams(variants=["grpo", "ada-balance"], matched_grpo=False, reference="grpo-matched")
    assert CompareParams(variants=["ada-pos", "ada-balance"], reference="ada-balance").reference == "ada-balance"
    assert CompareParams(variants=["ada-pos", "ada-balance"], matched_grpo=True, reference="grpo-matched").reference == "grpo-matched"
    assert CompareParams().reference == "grpo"


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


def test_every_override_key_is_checked_when_the_parameters_are_validated():
    """An unknown key, a value of the wrong type, or a key the flow sets itself is refused with the key named;
    the seed and preset given in overrides used to run silently under another seed's and preset's name."""
    refusals = {
        "unknown key 'sampler.MM': sampler has no field 'MM' (did you mean 'sampler.M'? its fields: M, M0, N, ": {"sampler.MM": 3},
        "unknown key 'optim.learning_rate': optim has no field 'learning_rate' (its fields: ": {"optim.learning_rate": 1},
        "unknown key 'sampler.MM'": {"sampler": {"MM": 3}},
        "'sampler.M': Input should be a valid integer": {"sampler.M": "eight"},
        "'optim.lr': Input should be greater than 0": {"optim.lr": -1},
        "unknown key 'sampler.M.x': sampler.M is a value": {"sampler.M.x": 1},
        "'seed' is set by this flow's own `seed` field": {"seed": 3},
        "'preset' is set by this flow's own `preset` field": {"preset": "grpo"},
        "'rollout.engine' is set by this flow's own `engine` field": {"rollout": {"engine": "vllm"}},
    }
    for shown, overrides in refusals.items():
        with pytest.raises(ValidationError, match=re.escape(shown)):
            TrainParams(overrides=overrides)
    with pytest.raises(ValidationError, match=re.escape("'seed' is set by this flow's own `seeds` field")):
        CompareParams(overrides={"seed": 1})
    with pytest.raises(ValidationError, match=re.escape("'sampler.M' is set by this flow's own `M` field")):
        SweepParams(overrides={"sampler.M": 2})
    with pytest.raises(ValidationError, match=re.escape("unknown key 'data.curation'")):
        CurateParams(overrides={"data.curation": 16})
    assert TrainParams(overrides={"sampler.M": 2, "optim": {"lr": 1e-4}}).config().optim.lr == 1e-4


def test_a_resume_carries_only_what_was_given():
    assert TrainParams(resume="run").resume_overrides() == {}
    given = TrainParams(resume="run", steps=9, engine="transformers", overrides={"eval_every": 3})
    assert given.resume_overrides() == {"steps": 9, "rollout": {"engine": "transformers"}, "eval_every": 3}


def test_the_parameter_schema_names_the_override_keys_so_the_server_refuses_a_run_at_creation():
    """A deployment enforces its parameter schema when a flow run is created (the Prefect form, the API):
    `overrides` lists its keys there, so an unknown one is refused before any worker picks the run up."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    from flows.train import train

    schema = parameter_schema(train).model_dump_for_openapi()
    validate({"params": {"overrides": {"sampler.M": 2, "optim": {"lr": 1e-4}}}}, schema, raise_on_error=True)
    for key in ("sampler.MM", "seed"):
        with pytest.raises(Exception, match=rf"Additional properties are not allowed \('{re.escape(key)}' was unexpected\)$"):
            validate({"params": {"overrides": {key: 1}}}, schema, raise_on_error=True)


@pytest.mark.parametrize("flow_name", ["train", "compare", "sweep", "curate", "paper_tables"])
def test_the_form_json_view_submits_and_an_unknown_key_marks_its_field(flow_name):
    """Prefect's form holds a free-form object field as `{"__prefect_kind": "json", "value": "<text>"}`; its
    JSON view submits `params` as JSON text with that wrapper inside, which the server does not unwrap. The
    server's checks (hydrate, then validate: prefect.server.api.deployments, /ui/schemas/validate) let it
    through, and the flow's parameters unwrap it. A key that is no config field is refused on `overrides`
    itself, in one short line (an `enum` of ~120 keys made a message listing them all)."""
    import importlib
    import json

    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate
    from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate
    from prefect.utilities.schema_tools.validation import build_error_obj

    flow = getattr(importlib.import_module(f"flows.{flow_name}"), flow_name)
    schema = parameter_schema(flow).model_dump_for_openapi()
    model = flow.fn.__annotations__["params"]
    model = getattr(importlib.import_module("flows.params"), model) if isinstance(model, str) else model

    def wrapped(value):
        return {"__prefect_kind": "json", "value": json.dumps(value)}

    form = {"overrides": wrapped({"eval_every": 3})}
    if flow_name == "paper_tables":
        form["pools"] = wrapped({"one": {"data.curation_k": 4}})
    submitted = {"params": {"__prefect_kind": "json", "value": json.dumps(form)}}
    hydrated = hydrate(submitted, HydrationContext())
    assert validate(hydrated, schema) == []
    params = model(**hydrated["params"])
    assert params.overrides == {"eval_every": 3}
    assert model(overrides={"__prefect_kind": "json"}).overrides == model().overrides  # an emptied box
    with pytest.raises(ValidationError, match="not valid JSON"):
        model(overrides={"__prefect_kind": "json", "value": "{"})
    if flow_name == "paper_tables":
        assert params.pools == {"one": {"data.curation_k": 4}}

    typed = {"params": {"overrides": wrapped({"sampler.MM": 8})}}  # the form view: the server unwraps it
    errors = validate(hydrate(typed, HydrationContext()), schema)
    assert build_error_obj(errors)["errors"] == [{"property": "params", "errors": [
        {"property": "overrides", "errors": ["Additional properties are not allowed ('sampler.MM' was unexpected)"]}]}]


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
    # An unedited compare is two arms, GRPO against Ada-balance: a third variant and the matched control, both
    # pre-selected, grew every two-arm comparison unless the user spotted them.
    assert compare["variants"]["default"] == ["grpo", "ada-balance"] and compare["seeds"]["default"] == [0]
    assert compare["regimes"]["default"] == ["default"] and compare["matched_grpo"]["default"] is False
    assert compare["curate"]["default"] is True and compare["eval_every"]["default"] is None
    a, b = CompareParams(), CompareParams()  # a literal list default is still one list per instance
    a.variants.append("dapo")
    assert b.variants == ["grpo", "ada-balance"]


def test_eval_every_is_a_form_field_that_reaches_every_run():
    """A 30-step run at the profile's eval_every (20 on testbed) drew a curve of three points, and the form had
    no field for it: now each training form has one, which reaches the config, a group's children and a resume's
    checks; given in overrides too it is refused."""
    from flows.group import child_params

    assert TrainParams(steps=30, eval_every=5).config().eval_every == 5
    assert TrainParams(profile="testbed").config().eval_every == 20  # empty: the profile's
    compare = CompareParams(steps=30, eval_every=3)
    child = child_params(compare, "grpo", 0, "grpo", "sqlite:///x.db", "parent", Path("/tmp/group"))
    assert child.eval_every == 3 and child.config().eval_every == 3
    assert TrainParams(resume="run", eval_every=4).resume_overrides() == {"eval_every": 4}
    assert SweepParams(eval_every=2).build("ada-balance", 0, group=True).eval_every == 2
    with pytest.raises(ValidationError, match=r"eval_every: given twice, 5 in the field and 3 in overrides"):
        TrainParams(eval_every=5, overrides={"eval_every": 3})


def test_the_demo_builds_on_the_calibrated_testbed():
    """`make demo`'s compare is valid before it starts: the testbed profile with the demo's smaller pool."""
    from flows.demo import DEMO_OVERRIDES, DEMO_PROFILE, DEMO_STEPS
    from flows.params import CompareParams

    params = CompareParams(profile=DEMO_PROFILE, variants=["grpo", "ada-balance"], steps=DEMO_STEPS,
                           overrides=DEMO_OVERRIDES)
    configs = [params.build(v, 0, group=True) for v in params.variants]
    assert {(c.model, c.steps, c.data.eval_size, c.data.seed) for c in configs} == {("tiny-l4", 60, 512, 0)}


@pytest.mark.parametrize("model", [TrainParams, CompareParams, SweepParams])
def test_the_form_says_what_an_empty_steps_or_prompts_per_step_runs(model):
    """The run form shows an empty field for `steps` and `prompts_per_step` (the profile's); its description says
    what each profile runs, read from the profiles, so nobody has to guess what `None` trains."""
    from ada_core.config import build_config

    schema = model.model_json_schema()["properties"]
    for profile in ("tiny", "testbed", "smollm2-135m", "paper"):
        config = build_config("grpo", profile)
        assert f"{config.steps} on {profile}" in schema["steps"]["description"]
        assert f"{config.prompts_per_step} on {profile}" in schema["prompts_per_step"]["description"]

