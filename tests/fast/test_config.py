"""Config validation: every error names its field; presets and profiles layer as documented."""

import pytest

from ada_core.config import (
    PRESETS,
    PROFILES,
    ConfigError,
    SamplerConfig,
    build_config,
    flat_params,
    parse_set,
)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"sampler": {"n": 1}}, "sampler.n"),
        ({"sampler": {"M": 0}}, "sampler.M"),
        ({"sampler": {"N": 0}}, "sampler.N"),
        ({"sampler": {"M0": 0}}, "sampler.M0"),
        ({"sampler": {"global_sample_cap": 0}}, "sampler.global_sample_cap"),
        ({"sampler": {"positive_threshold": 1.5}}, "sampler.positive_threshold"),
        ({"sampler": {"positive_threshold": -0.1}}, "sampler.positive_threshold"),
        ({"sampler": {"exit_rule": "neg"}}, "sampler.exit_rule"),
        ({"sampler": {"std_eps": 0}}, "sampler.std_eps"),
        ({"sampler": {"gen_batch_multiplier": 0}}, "sampler.gen_batch_multiplier"),
        ({"advantage": {"name": "ppo"}}, "advantage.name"),
        ({"advantage": {"eps": 0}}, "advantage.eps"),
        ({"loss": {"clip_low": 1.0}}, "loss.clip_low"),
        ({"loss": {"dual_clip_c": 1.0}}, "loss.dual_clip_c"),
        ({"rollout": {"top_p": 0}}, "rollout.top_p"),
        ({"rollout": {"temperature": 0}}, "rollout.temperature"),
        ({"data": {"pass_rate_ceiling": 1.5}}, "data.pass_rate_ceiling"),
        ({"optim": {"lr": 0}}, "optim.lr"),
        ({"sampler": {"typo_field": 1}}, "sampler.typo_field"),
    ],
)
def test_bad_value_names_the_dotted_field(overrides, field):
    with pytest.raises(ConfigError, match=f"^invalid config: {field.replace('.', '[.]')}:") as err:
        build_config("ada-balance", "tiny", overrides=overrides)
    assert "\n" not in str(err.value)  # one line


def test_rounds_must_be_able_to_fill_a_group():
    # M0 + (N - 1) * M = 2 + 0 < 4
    with pytest.raises(ConfigError, match=r"sampler\.M0 \+ \(sampler\.N - 1\) \* sampler\.M = 2 must be >= sampler\.n = 4"):
        build_config("ada-balance", "tiny", overrides={"sampler": {"M0": 2, "N": 1}})
    assert SamplerConfig(name="ada", n=4, M=1, N=4).max_samples_per_prompt == 4  # exactly enough is fine
    assert SamplerConfig(name="fixed", n=4, M=1, N=1).max_samples_per_prompt == 4  # only ada is checked


def test_unknown_preset_and_profile():
    with pytest.raises(ConfigError, match=r"^preset: unknown 'ppo'"):
        build_config("ppo", "tiny")
    with pytest.raises(ConfigError, match=r"^profile: unknown 'huge'"):
        build_config("grpo", "huge")


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_preset_builds_on_every_profile(preset, profile):
    cfg = build_config(preset, profile)
    assert (cfg.preset, cfg.profile) == (preset, profile)


def test_presets_choose_the_algorithm():
    assert build_config("grpo").sampler.name == "fixed" and build_config("grpo").advantage.name == "grpo"
    assert build_config("dapo").sampler.name == "dynamic_filter"
    pos, bal = build_config("ada-pos", "paper"), build_config("ada-balance", "paper")
    assert (pos.sampler.exit_rule, bal.sampler.exit_rule) == ("pos", "balance")
    assert (bal.sampler.M, bal.sampler.N, bal.sampler.n, bal.advantage.name) == (8, 4, 4, "global_mean")


def test_profile_round_size_reaches_ada_presets():
    # The tiny profile's M=4 must survive the ada presets layered on top of it.
    assert build_config("ada-balance", "tiny").sampler.M == 4
    assert build_config("ada-balance", "paper").sampler.M == 8


def test_layering_order(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("prompts_per_step: 7\nsampler:\n  M: 6\n")
    cfg = build_config("ada-balance", "tiny", config_file=path, overrides={"sampler": {"M": 5}})
    assert cfg.prompts_per_step == 7  # file beats profile
    assert cfg.sampler.M == 5  # --set beats file
    assert cfg.sampler.exit_rule == "balance" and cfg.optim.lr == 3e-4  # preset and profile still there


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(config_file=tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        build_config(config_file=bad)


def test_parse_set_nests_and_parses_yaml_values():
    assert parse_set(["sampler.M=8", "loss.dual_clip_c=null", "sampler.exit_rule=pos", "optim.lr=3e-4"]) == {
        "sampler": {"M": 8, "exit_rule": "pos"},
        "loss": {"dual_clip_c": None},
        "optim": {"lr": 3e-4},
    }
    cfg = build_config("ada-pos", "tiny", overrides=parse_set(["sampler.M=2", "loss.dual_clip_c=null"]))
    assert cfg.sampler.M == 2 and cfg.loss.dual_clip_c is None


@pytest.mark.parametrize(
    "assignments, match",
    [
        (["sampler.M"], "expected key=value"),
        (["sampler..M=3"], "empty key segment"),
        (["=3"], "empty key segment"),
        (["sampler=1", "sampler.M=2"], "sampler was already set to a value"),
        (["sampler.M=2", "sampler=1"], "sampler already has nested settings"),
    ],
)
def test_parse_set_rejects_malformed(assignments, match):
    with pytest.raises(ValueError, match=match):
        parse_set(assignments)


def test_flat_params_are_dotted():
    params = flat_params(build_config("ada-balance", "tiny"))
    assert params["sampler.M"] == 4 and params["advantage.name"] == "global_mean" and params["seed"] == 0


def test_presets_differ_only_in_the_algorithm():
    """Two presets on one profile differ in ALGORITHM_FIELDS and nothing else (weight decay included),
    so a comparison of presets compares algorithms."""
    from itertools import combinations

    from ada_core.config import ALGORITHM_FIELDS
    from ada_core.config.presets import is_algorithm_field
    from flows.params import flatten_dotted

    for preset, values in PRESETS.items():
        extra = set(flatten_dotted(values)) - set(ALGORITHM_FIELDS)
        assert not extra, f"preset {preset} sets {sorted(extra)}, which are not algorithm fields"
    for profile in PROFILES:
        built = {p: flat_params(build_config(p, profile)) for p in PRESETS}
        for a, b in combinations(PRESETS, 2):
            differ = {k for k in built[a].keys() | built[b].keys() if built[a].get(k) != built[b].get(k)}
            outside = sorted(k for k in differ if not is_algorithm_field(k))  # sampler.options.<field> is inside
            assert not outside, (profile, a, b, outside)
