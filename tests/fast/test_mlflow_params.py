"""MLflow's `n/a` reads each field's declared applicability (ada_core/config/applies.py), not its description."""

from __future__ import annotations

from ada_core.config import build_config
from flows import tracking

FACTS = {"run.curate": False, "run.device": "cpu"}


def test_mlflow_logs_what_each_run_reads_and_n_a_for_the_rest():
    est = tracking.run_params(build_config("ada-posterior", "tiny"), "ada-posterior", "digest", facts=FACTS)
    for key in ("N", "M", "sampler.N", "sampler.M", "sampler.unresolved", "sampler.downsample", "sampler.budget",
                "sampler.allocation"):
        assert est[key] != tracking.NOT_APPLICABLE, key  # the budgeted sampler reads them
    assert est["sampler.exit_rule"] == est["sampler.window"] == tracking.NOT_APPLICABLE  # it always uses `mixed`
    paper_est = tracking.run_params(build_config("ada-est", "tiny"), "ada-est", "digest", facts=FACTS)
    for key in ("sampler.budget", "sampler.est_prior", "sampler.est_min", "sampler.est_ema",
                "sampler.unresolved"):
        assert paper_est[key] != tracking.NOT_APPLICABLE, key  # the paper's Est reads them
    for key in ("N", "M", "sampler.allocation", "sampler.forget", "sampler.downsample", "sampler.exit_rule"):
        assert paper_est[key] == tracking.NOT_APPLICABLE, key  # and not these
    assert est["sampler.est_min"] == est["sampler.est_weighting"] == tracking.NOT_APPLICABLE
    for preset in ("grpo", "ada-balance"):
        params = tracking.run_params(build_config(preset, "tiny"), preset, "digest", facts=FACTS)
        for key in ("sampler.budget", "sampler.allocation", "sampler.prior_strength", "sampler.forget",
                    "sampler.skip_confidence", "sampler.explore_after", "sampler.prior_weight"):
            assert params[key] == tracking.NOT_APPLICABLE, (preset, key)
    grpo = tracking.run_params(build_config("grpo", "tiny"), "grpo", "digest", facts=FACTS)
    assert (grpo["N"], grpo["M"], grpo["sampler.exit_rule"]) == ("n/a", "n/a", "n/a")
    assert grpo["rollout.vllm.concurrency"] == grpo["distributed.cpus_per_rank"] == tracking.NOT_APPLICABLE
    assert grpo["optim.lr"] == build_config("grpo", "tiny").optim.lr and grpo["preset"] == "grpo"  # a label: logged
