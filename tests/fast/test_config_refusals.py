"""Combinations that cannot work are refused when the config is built, naming the field: before any model,
server or Ray start (issue 22 items 3, 4 and 10's `zero_stage: 3`)."""

from __future__ import annotations

import pytest

from ada_core.config import ConfigError, build_config
from ada_core.config.schema import OptimConfig

STREAMING = {"sampler": {"schedule": "streaming"}, "rollout": {"engine": "vllm"}}


def test_streaming_over_a_pool_of_servers_builds():
    # Issue 20 lifted the refusal: the pool streams (tests/services/test_vllm_pool.py).
    for vllm in ({"num_servers": 2}, {"base_urls": ["http://127.0.0.1:9", "http://127.0.0.1:10"]},
                 {"base_urls": ["http://127.0.0.1:9"]}):
        cfg = build_config("ada-balance", "tiny", overrides={**STREAMING, "rollout": {"engine": "vllm", "vllm": vllm}})
        assert cfg.sampler.schedule == "streaming"
    build_config("ada-balance", "tiny", overrides=STREAMING)


def test_zero_stage_3_is_refused_by_the_schema():
    with pytest.raises(ConfigError, match=r"optim\.zero_stage: Input should be 0, 1 or 2 \(got 3\)"):
        build_config("grpo", "tiny", overrides={"optim": {"zero_stage": 3}})
    assert "Not 3" in OptimConfig.model_fields["zero_stage"].description


def test_a_global_sample_cap_below_n_is_refused():
    with pytest.raises(ConfigError, match=r"sampler\.global_sample_cap = 3 is below sampler\.n = 4"):
        build_config("ada-balance", "tiny", overrides={"sampler": {"global_sample_cap": 3}})
    build_config("ada-balance", "tiny", overrides={"sampler": {"global_sample_cap": 4}})


def test_a_field_set_where_the_run_never_reads_it_is_refused_naming_where_it_applies(tmp_path):
    with pytest.raises(ConfigError, match=r"sampler\.window: set to 4, but this run never reads it: it applies only "
                                          r"when sampler\.name == ada and sampler\.schedule == streaming "
                                          r"\(here sampler\.name = fixed, sampler\.schedule = rounds\)"):
        build_config("grpo", "tiny", overrides={"sampler": {"window": 4}})
    config_file = tmp_path / "run.yaml"
    config_file.write_text("distributed:\n  cpus_per_rank: 2\n")
    with pytest.raises(ConfigError, match=r"distributed\.cpus_per_rank: .*distributed\.num_ranks > 1"):
        build_config("grpo", "tiny", config_file=config_file)
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.concurrency: .*rollout\.engine == vllm"):
        build_config("grpo", "tiny", overrides={"rollout": {"vllm": {"concurrency": 8}}})
    # Where they apply they are taken; a profile's value for another sampler (tiny's sampler.M under GRPO) is not
    # the user's and stays (logged as n/a).
    assert build_config("ada-balance", "tiny", overrides={**STREAMING, "sampler": {"schedule": "streaming",
                                                                                   "window": 4}}).sampler.window == 4
    assert build_config("grpo", "tiny").sampler.M == 4


def test_a_groups_shared_override_goes_to_the_variants_that_read_it():
    from flows.params import CompareParams

    params = CompareParams(variants=["grpo", "ada-balance"], overrides={"sampler.M": 2, "optim.lr": 1e-4})
    grpo, ada = params.build("grpo", 0, group=True), params.build("ada-balance", 0, group=True)
    assert params.shared_overrides_for(grpo) == {"optim.lr": 1e-4}  # GRPO would refuse sampler.M
    assert params.shared_overrides_for(ada) == {"sampler.M": 2, "optim.lr": 1e-4}
    params.check_shared_overrides([grpo, ada])
    with pytest.raises(ConfigError, match=r"sampler\.M: set to 2, but this run never reads it"):
        params.build("grpo", 0)  # one run on its own
    only_grpo = CompareParams(variants=["grpo"], matched_grpo=False, overrides={"sampler.M": 2})
    with pytest.raises(ConfigError, match=r"overrides\.sampler\.M: no run of this group reads it: it applies only "
                                          r"when sampler\.name in \[ada, budgeted\]"):
        only_grpo.check_shared_overrides([only_grpo.build("grpo", 0, group=True)])


# --- issue 26 finding 5: a rule that cannot be decided refuses, it does not pass -------------------------
CURATION = {"data.keep_pass_rate": [0.0625, 0.125], "data.curation_k": 16, "data.pass_rate_ceiling": 0.2}


@pytest.mark.parametrize("key", sorted(CURATION))
def test_ada_train_refuses_curation_fields_it_never_reads(key, tmp_path, monkeypatch):
    """`ada train` never curates: a curation field is one line, exit 2, naming it; nothing is built."""
    from typer.testing import CliRunner

    from ada_core.cli import INPUT_ERROR_EXIT, app

    monkeypatch.setenv("ADA_HOME", str(tmp_path / "home"))
    value = CURATION[key]
    shown = f"[{', '.join(map(str, value))}]" if isinstance(value, list) else str(value)
    result = CliRunner().invoke(app, ["train", "--steps", "1", "--set", f"{key}={shown}"])
    assert result.exit_code == INPUT_ERROR_EXIT, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: set to "), lines
    assert "never reads it" in lines[0] and "run.curate == true" in lines[0] and "does not curate" in lines[0]
    assert not (tmp_path / "home").exists()


def test_the_train_flow_takes_curation_fields_only_when_it_curates():
    from flows.params import CompareParams, TrainParams

    for key, value in CURATION.items():
        overrides = {key: value}
        with pytest.raises(ConfigError, match=rf"{key}: set to .*never reads it.*run\.curate = false"):
            TrainParams(preset="grpo", curate=False, overrides=overrides).config()
        assert TrainParams(preset="grpo", curate=True, overrides=overrides).config()
    # a group that does not curate: its shared curation override is read by none of its children
    params = CompareParams(variants=["grpo"], matched_grpo=False, curate=False, overrides={"data.keep_pass_rate": [0.0625, 0.125]})
    with pytest.raises(ConfigError, match=r"overrides\.data\.keep_pass_rate: no run of this group reads it"):
        params.check_shared_overrides([params.build("grpo", 0, group=True)])
    params = CompareParams(variants=["grpo"], matched_grpo=False, curate=True, overrides={"data.keep_pass_rate": [0.0625, 0.125]})
    params.check_shared_overrides([params.build("grpo", 0, group=True)])


def test_a_rule_whose_run_fact_is_not_given_is_undecided_never_held():
    from ada_core.config import TrainConfig
    from ada_core.config.applies import Undecided, applicability, not_applicable

    rules = applicability(TrainConfig)
    config = build_config("grpo", "tiny")
    for key in (*CURATION, "rollout.vllm.gpu_memory_utilization"):
        vllm = build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm"}},
                            facts={"run.curate": False, "run.device": "cpu"})
        assert rules[key].truth(vllm if "vllm" in key else config, {}) is None, key
        with pytest.raises(Undecided):
            rules[key].holds(vllm if "vllm" in key else config)
    # an `or` decided by its config clause needs no fact: transformers reads rollout.micro_batch_size anyway
    assert rules["rollout.micro_batch_size"].truth(config, {}) is True
    with pytest.raises(Undecided, match=r"(sft\.shipped|data\.curation_k): .*run\.curate is not given"):
        not_applicable(config, {"run.device": "cpu"})
    # a config built without the facts refuses a field it cannot show to be read, naming the fact
    with pytest.raises(ConfigError, match=r"data\.curation_k: set to 4, but whether this run reads it cannot be "
                                          r"decided: .*run\.curate is not known"):
        build_config("grpo", "tiny", overrides={"data": {"curation_k": 4}})
    assert build_config("grpo", "tiny", overrides={"data": {"curation_k": 4}},
                        facts={"run.curate": True, "run.device": "cpu"}).data.curation_k == 4
