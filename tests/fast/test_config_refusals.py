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
