"""The public sampler API (ada_core/config/registry.py; docs/SAMPLERS.md): a sampler registered by name is
chosen, validated, built, listed and logged like the platform's own, and a bad one is refused in one line.

Every test leaves the registry and the presets as it found them (tests/conftest.py, sampler_registry_restored).
tests/flows/test_own_sampler.py runs examples/second_chance.py through simulate, train and compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from pydantic import Field

from ada_core.config import PRESETS, AdvantageConfig, ConfigError, SamplerConfig, build_config, flat_params
from ada_core.protocols import SamplingParams
from ada_core.sampling import (AdaSampler, EstSampler, FixedSampler, PluginError, SamplerOptions, finish_batch,
                               get_sampler, make_sampler, options_of, register_sampler, sampler_names)
from ada_core.config import registry
from ada_core.config.presets import preset_names

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "second_chance.py"


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """No $ADA_SAMPLERS from the shell; tests/conftest.py's sampler_registry_restored puts back the registry,
    the presets and the plugins imported after each test."""
    monkeypatch.delenv(registry.PLUGINS_ENV, raising=False)
    registry.load_plugins()


class KOptions(SamplerOptions):
    k: int = Field(2, ge=1, description="Samples per prompt.")


def define(name: str = "take_k", presets=None, options=KOptions):
    """A minimal sampler: `k` samples per prompt (its option), every group kept."""

    @register_sampler(name, options=options, presets=presets)
    @dataclass
    class TakeK:
        cfg: SamplerConfig
        advantage: AdvantageConfig

        def sample(self, prompts, engine, verifier, sampling, rng, source=None):
            from ada_core.records import PromptPool
            from ada_core.sampling import StepClock, draw_and_score, make_group

            clock, k = StepClock(), options_of(self.cfg).k
            pools = [PromptPool(p, rounds=1, exit_reason="drawn") for p in prompts]
            clock.active_per_round.append(len(pools))
            for pool, samples in zip(pools, draw_and_score([(p, k) for p in prompts], 0, engine, verifier, sampling,
                                                           rng, clock)):
                pool.samples.extend(samples)
            groups = [make_group(pool, pool.samples, self.advantage, self.cfg.positive_threshold) for pool in pools]
            return finish_batch(pools, groups, clock, self.cfg, ["drawn"])

        def state_dict(self):
            return None

        def load_state_dict(self, state):
            pass

        def close(self):
            pass

    return TakeK


def draw(cfg: SamplerConfig, advantage: AdvantageConfig | None = None, steps: int = 2):
    from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, make_prompts

    prompts = make_prompts(8, np.random.default_rng(0))
    sampler = make_sampler(cfg, advantage or AdvantageConfig())
    return [sampler.sample(prompts, BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14),
                           np.random.default_rng(step)) for step in range(steps)]


def test_the_built_in_samplers_are_registered_through_the_same_decorator():
    assert sampler_names()[:5] == ["ada", "budgeted", "dynamic_filter", "est", "fixed"]
    assert get_sampler("ada").cls is AdaSampler and get_sampler("est").cls is EstSampler
    assert all(get_sampler(n).builtin and get_sampler(n).options is None for n in sampler_names()[:5])
    # then the research samplers (ada_core/sampling/research.py), shipped with options of their own
    assert sampler_names()[5:9] == ["ada_v3w", "greso", "knapsack", "pilot"]
    assert all(get_sampler(n).builtin and get_sampler(n).options is not None for n in sampler_names()[5:9])
    assert isinstance(make_sampler(SamplerConfig(name="fixed"), AdvantageConfig()), FixedSampler)


def test_a_registered_sampler_is_chosen_by_sampler_name_and_its_preset_builds_a_run():
    cls = define(presets={"take-3": {"sampler": {"n": 3, "options": {"k": 3}}}})
    assert "take_k" in sampler_names() and not get_sampler("take_k").builtin
    config = build_config("take-3", "tiny")
    assert (config.sampler.name, config.sampler.n, config.sampler.options) == ("take_k", 3, {"k": 3})
    assert config.advantage.name == "grpo"  # a preset that gives none takes the default estimator
    assert isinstance(make_sampler(config.sampler, config.advantage), cls)
    assert flat_params(config)["sampler.options.k"] == 3  # an MLflow param of its own
    batch = draw(config.sampler, steps=1)[0]
    assert {len(g.samples) for g in batch.groups} == {3}
    assert batch.metrics["budget/generated_samples"] == 24 and batch.metrics["sampler/exit_drawn"] == 8


def test_without_presets_a_sampler_gets_one_named_after_it_with_its_defaults():
    define("take_k")
    config = build_config("take-k", "tiny", overrides={"sampler": {"options": {"k": 5}}})
    assert (config.preset, config.sampler.name, config.sampler.options) == ("take-k", "take_k", {"k": 5})
    assert build_config("take-k", "tiny").sampler.options == {"k": 2}  # defaults filled in, so logged too


def test_an_option_changes_what_the_sampler_draws():
    define()
    few, more = (draw(SamplerConfig(name="take_k", options={"k": k})) for k in (2, 5))
    assert [b.metrics["budget/generated_samples"] for b in few] == [16, 16]
    assert [b.metrics["budget/generated_samples"] for b in more] == [40, 40]


def test_a_name_taken_is_refused_naming_who_has_it():
    with pytest.raises(PluginError, match=r"register_sampler\('ada'\) on .*TakeK: the name is taken by "
                                          r"ada_core.sampling.samplers:AdaSampler; choose another name"):
        define("ada", presets={})
    first = define("mine")
    assert define("mine") is not first and get_sampler("mine").cls.__qualname__ == first.__qualname__  # one class
    # from one file imported twice (by module name and by path) is one sampler: the later import replaces it


def test_an_unknown_sampler_name_lists_the_registered_ones():
    define()
    with pytest.raises(ConfigError, match=r"^invalid config: sampler.name: unknown sampler 'nope'; choose from "
                                          r"\['ada', 'budgeted', 'dynamic_filter', 'est', 'fixed', 'ada_v3w', 'greso', 'knapsack', 'pilot', "
                                          r"'take_k'\]"):
        build_config("grpo", "tiny", overrides={"sampler": {"name": "nope"}})


@pytest.mark.parametrize("options, message", [
    ({"kk": 1}, "sampler.options.kk: sampler 'take_k' has no such option (its options: k)"),
    ({"k": 0}, "sampler.options.k: Input should be greater than or equal to 1 (got 0)"),
    ({"k": "many"}, "sampler.options.k: Input should be a valid integer"),
])
def test_a_plugins_options_are_validated_as_strictly_as_the_platforms_fields(options, message):
    define()
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config("take-k", "tiny", overrides={"sampler": {"options": options}})


def test_a_built_in_sampler_refuses_options():
    with pytest.raises(ConfigError, match=r"sampler.options: sampler 'ada' takes no options; remove \['k'\]"):
        build_config("ada-balance", "tiny", overrides={"sampler": {"options": {"k": 1}}})


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "Bad-Name"}, "a sampler name is lower-case letters"),
    ({"options": dict}, "options must be a subclass of ada_core.sampling.SamplerOptions"),
    ({"presets": {"p": {"optim": {"lr": 1.0}}}}, "preset 'p': sets optim.lr; a preset sets only sampler.n, "
                                                 "sampler.options, advantage.name"),
    ({"presets": {"p": {"sampler": {"exit_rule": "pos"}}}}, "preset 'p': sets sampler.exit_rule; a preset sets"),
    ({"presets": {"p": {"sampler": {"name": "ada"}}}}, "preset 'p': sets sampler.name='ada'"),
])
def test_a_bad_registration_is_refused_in_one_line(kwargs, message):
    with pytest.raises(PluginError, match=message) as err:
        define(**{"name": "take_k", **kwargs})
    assert "\n" not in str(err.value)


def test_a_preset_named_like_another_is_refused_naming_whose_it_is():
    define("take_k", presets={"grpo": {}})
    with pytest.raises(PluginError, match=r"^register_sampler\('take_k'\) preset 'grpo': a preset of that name exists "
                                          r"\(sampler 'fixed'\); choose another name$"):
        build_config("grpo", "tiny")
    registry._SAMPLERS.pop("take_k")
    define("take_k", presets={"mine": {}})
    with pytest.raises(PluginError, match="preset 'mine': sampler 'take_k' registered a preset of that name"):
        define("other", presets={"mine": {}})


def test_an_option_without_a_description_and_a_class_without_the_contract_are_refused():
    class Bare(SamplerOptions):
        k: int = 1

    with pytest.raises(PluginError, match="option 'k' of Bare has no description"):
        define(options=Bare)
    with pytest.raises(PluginError, match=r"a sampler is a class with sample, state_dict, load_state_dict, close "
                                          r"\(ada_core.protocols.Sampler\); it lacks state_dict, load_state_dict, "
                                          r"close"):
        register_sampler("half")(type("Half", (), {"sample": lambda self: None}))


def test_ada_samplers_names_a_file_or_module_and_a_broken_one_is_named(monkeypatch):
    monkeypatch.setenv(registry.PLUGINS_ENV, str(EXAMPLE))
    assert "second_chance" in sampler_names() and "second-chance" in preset_names()
    monkeypatch.setenv(registry.PLUGINS_ENV, f"{EXAMPLE}, no_such_module_here")
    with pytest.raises(PluginError, match=r"^\$ADA_SAMPLERS item 'no_such_module_here' failed to load: "
                                          r"ModuleNotFoundError: No module named 'no_such_module_here'$"):
        sampler_names()


def test_the_forms_list_a_registered_samplers_preset_and_accept_its_options(monkeypatch):
    from flows.params import CompareParams, PaperTablesParams, SweepParams, TrainParams

    monkeypatch.setenv(registry.PLUGINS_ENV, str(EXAMPLE))
    assert "second-chance" in TrainParams.model_json_schema()["properties"]["preset"]["enum"]
    for params in (CompareParams, SweepParams):
        schema = params.model_json_schema()["properties"]
        assert "second-chance" in schema["variants"]["items"]["enum"]
        assert "sampler.options.extra" in schema["overrides"]["else"]["properties"]
    assert "second-chance" in PaperTablesParams.model_json_schema()["properties"]["methods"]["items"]["enum"]

    compare = CompareParams(variants=["grpo", "second-chance"], matched_grpo=False,
                            overrides={"sampler.options.extra": 2})
    assert compare.build("second-chance", 0, group=True).sampler.options == {"extra": 2, "give_up": 2}
    assert compare.build("grpo", 0, group=True).sampler.options == {}  # the group's option goes to its variant only
    assert SweepParams(variants=["second-chance"], n=[4, 8]).grid() == [
        ("second-chance", "second-chance-n4", {"sampler": {"n": 4}}),
        ("second-chance", "second-chance-n8", {"sampler": {"n": 8}})]
    with pytest.raises(ValueError, match=r"overrides: 'sampler.options.extra': Input should be greater than or "
                                         r"equal to 1"):
        CompareParams(variants=["grpo", "second-chance"], matched_grpo=False, overrides={"sampler.options.extra": 0})
    with pytest.raises(ConfigError, match="overrides.sampler.options.extra: no run of this group reads it"):
        params = CompareParams(variants=["grpo"], matched_grpo=False, overrides={"sampler.options.extra": 2})
        params.check_shared_overrides([params.build("grpo", 0, group=True)])
    with pytest.raises(ValueError, match=r"unknown preset 'nope'; choose from grpo, .*, second-chance"):
        TrainParams(preset="nope")


def test_mlflow_params_and_the_reports_config_table_carry_a_plugins_options(monkeypatch):
    from flows.tracking.logger import run_params
    from report.configs import config_differences
    from report.curves import RunCurves

    monkeypatch.setenv(registry.PLUGINS_ENV, str(EXAMPLE))
    config = build_config("second-chance", "tiny", overrides={"sampler": {"options": {"extra": 3}}})
    params = run_params(config, "second-chance", "digest", facts={"run.curate": False, "run.device": "cpu"})
    assert (params["sampler"], params["sampler.options.extra"], params["sampler.options.give_up"]) == (
        "second_chance", 3, 2)
    runs = [RunCurves(label, 0, Path(label), None, [], build_config(preset, "tiny").model_dump())
            for label, preset in (("grpo", "grpo"), ("second-chance", "second-chance"))]
    kinds = {row["field"]: row["kind"] for row in config_differences(runs)}
    assert kinds["sampler.options.extra"] == kinds["sampler.name"] == "algorithm"


def test_the_example_keeps_its_state_across_steps_and_restores_it(monkeypatch):
    monkeypatch.setenv(registry.PLUGINS_ENV, str(EXAMPLE))
    config = build_config("second-chance", "tiny", overrides={"sampler": {"options": {"give_up": 1}}})
    from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, make_prompts

    prompts = make_prompts(16, np.random.default_rng(1))
    args = (BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14))
    first = make_sampler(config.sampler, config.advantage)
    one = first.sample(prompts, *args, np.random.default_rng(0))
    stuck = {p.prompt.id for p in one.pools if p.exit_reason == "unresolved"}
    assert stuck and one.metrics["sampler/second_chances"] > 0
    resumed = make_sampler(config.sampler, config.advantage)
    resumed.load_state_dict(first.state_dict())  # as a resume does, from trainer_state.json
    two = resumed.sample(prompts, *args, np.random.default_rng(1))
    assert not any(p.rounds == 2 for p in two.pools if p.prompt.id in stuck)  # give_up 1: no second chance again
    again = first.sample(prompts, *args, np.random.default_rng(1))
    untimed = lambda batch: {k: v for k, v in batch.metrics.items() if not k.endswith("_s")}  # noqa: E731
    assert untimed(two) == untimed(again) and [p.samples for p in two.pools] == [p.samples for p in again.pools]


def _installed_plugin(tmp_path: Path, body: str) -> dict[str, str]:
    """A package on a fresh path, with a dist-info whose entry_points.txt names `myplug` in ada_platform.samplers."""
    (tmp_path / "myplug").mkdir()
    (tmp_path / "myplug" / "__init__.py").write_text(textwrap.dedent(body))
    info = tmp_path / "myplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nmyplug = myplug\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "OMP_NUM_THREADS": "1"}


def test_an_installed_packages_entry_point_registers_its_sampler(tmp_path):
    env = _installed_plugin(tmp_path, f"""
        from ada_core.sampling import register_sampler
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("second_chance_copy", {str(EXAMPLE)!r})
        module = importlib.util.module_from_spec(spec)
        sys.modules["second_chance_copy"] = module
        spec.loader.exec_module(module)
        register_sampler("myplug", presets={{"myplug": {{}}}})(module.SecondChanceSampler)
    """)
    code = ("from ada_core.config import build_config; c = build_config('myplug', 'tiny'); "
            "print(c.sampler.name, __import__('ada_core.sampling').sampling.sampler_names()[-2:])")  # plugins last
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["myplug", "['myplug',", "'second_chance']"]


def test_a_broken_entry_point_is_one_line_and_exit_2(tmp_path):
    env = _installed_plugin(tmp_path, "raise RuntimeError('half-written plugin')\n")
    out = subprocess.run([sys.executable, "-m", "ada_core.cli", "simulate", "--prompts", "4", "--steps", "1"],
                         env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr == ("error: sampler plugin entry point 'myplug' (myplug, group ada_platform.samplers) failed to "
                          "load: RuntimeError: half-written plugin\n")


def test_what_a_registered_preset_may_set_is_part_of_the_algorithm():
    from ada_core.config import ALGORITHM_FIELDS

    assert set(registry.PRESET_FIELDS) <= set(ALGORITHM_FIELDS)


def test_prefects_parameter_schema_of_the_flows_offers_a_registered_preset(monkeypatch):
    """What the Prefect server stores for a deployment and its run form draws: the flow's parameter schema."""
    import json

    from prefect.utilities.callables import parameter_schema

    from flows.compare import compare
    from flows.train import train

    monkeypatch.setenv(registry.PLUGINS_ENV, str(EXAMPLE))
    for flow in (train, compare):
        schema = json.dumps(parameter_schema(flow).model_dump())
        assert '"second-chance"' in schema and '"sampler.options.extra"' in schema, flow.name
