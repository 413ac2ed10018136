"""The update across Ray ranks (real Ray, real DeepSpeed on gloo, the real tiny model) against one rank.

Ray is started once for the module (`ray_local`), the way `RankGroup` starts it, and each group's
ranks are its actors; the training test runs first and starts its own Ray through the trainer, so
its teardown can be checked by pid.
"""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch

from ada_core import metrics as K
from ada_core.config import DistributedConfig, LossConfig, OptimConfig, build_config
from ada_core.engines.deepspeed_engine import DeepSpeedUpdateEngine
from ada_core.engines.micro_batch import collate
from ada_core.engines.ray_cluster import start_ray
from ada_core.engines.rank_group import RankError, RankGroup
from ada_core.engines.transformers_engine import TransformersRolloutEngine
from ada_core.engines.update_plan import flatten, plan_update
from ada_core.rl.losses import gather_logprobs, ppo_clip_loss
from ada_core.models import format_prompt_ids, load_policy
from ada_core.protocols import SamplingParams
from ada_core.records import Group, Prompt, Sample
from ada_core.training import run_steps, setup
from ada_core.run.checkpoints import latest_checkpoint
from ada_core.run.files import read_metrics

pytestmark = pytest.mark.slow

OPTIM = dict(lr=1e-3, warmup_steps=0, mini_batches=1, micro_batch_size=2)
TWO_RANKS = DistributedConfig(num_ranks=2, startup_timeout_s=240)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def policy(tiny_model):
    return load_policy(tiny_model)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; only its parent has not reaped it yet
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


# --- training through the trainer (its own Ray) ------------------------------------------------


def test_two_rank_training_resumes_identically_and_leaves_no_process(tmp_path):
    import ray

    assert not ray.is_initialized()
    overrides = {"steps": 3, "prompts_per_step": 6, "eval_every": 0, "checkpoint_every": 2, "sft_steps": 0,
                 "data": {"train_size": 64, "eval_size": 8}, "optim": {"micro_batch_size": 8},
                 # Without the SFT warm start the tiny model scores 0, so every advantage is 0; the
                 # entropy bonus still gives every step a gradient through both ranks. The KL term runs
                 # against the run's initial weights, which every rank loads from the run folder.
                 "loss": {"entropy_coef": 0.01, "kl_coef": 0.1},
                 "distributed": {"num_ranks": 2, "startup_timeout_s": 240}}
    config = build_config("ada-balance", "tiny", overrides=overrides)
    state = setup(config, tmp_path / "run")
    try:
        pids = state.updater.process_ids()
        assert len(pids["ranks"]) == 2 and pids["ray"], pids
        _check_listeners_and_ray_auth(pids)
        before = [p.detach().clone() for p in state.updater.module.parameters()]
        last = run_steps(state)
        after = [p.detach().clone() for p in state.updater.module.parameters()]
    finally:
        state.close()
    assert not ray.is_initialized()
    assert _wait_gone(pids["ranks"] + pids["ray"]) == [], "a Ray or rank process outlived close()"
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "no weight changed"
    assert last[K.DIST_WORLD_SIZE] == 2.0 and last[K.TRAIN_GRAD_NORM] > 0
    assert last[K.TRAIN_KL_REF] > 0, "the ranks trained without their reference policy"
    assert last[K.DIST_RANK_UPDATE_MAX_S] >= last[K.DIST_RANK_UPDATE_MIN_S] > 0
    assert (tmp_path / "run" / "ranks" / "rank_1.log").stat().st_size > 0
    ckpt = latest_checkpoint(tmp_path / "run")
    assert sorted(p.name for p in (ckpt / "optimizer").iterdir()) == ["rank_0", "rank_1", "update_engine.pt"]

    # Resume from the step-2 checkpoint: step 3 draws and trains exactly as the uninterrupted run did.
    import shutil

    shutil.rmtree(ckpt)
    resumed = setup(config, tmp_path / "resumed", resume=tmp_path / "run")
    try:
        assert resumed.step == 2
        run_steps(resumed)
        resumed_weights = [p.detach().clone() for p in resumed.updater.module.parameters()]
    finally:
        resumed.close()
    row = read_metrics(tmp_path / "run")[-1]
    again = read_metrics(tmp_path / "resumed")[-1]
    assert again["step"] == row["step"] == 3
    for key in (K.REWARD_MEAN, K.BUDGET_GENERATED_TOKENS, K.TRAIN_LOSS, K.TRAIN_GRAD_NORM, K.TRAIN_KL_REF):
        assert again[key] == pytest.approx(row[key], rel=1e-5, abs=1e-7), key
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(after, resumed_weights))
    # Resuming it with another world size is refused: test_checkpoints_hold_every_ranks_state_and_refuse_...


def test_ranks_that_cannot_be_placed_are_a_clear_error(policy, tiny_model, tmp_path):
    """A local Ray only has this machine's GPUs, so asking for more fails at once, before Ray starts."""
    import ray

    if ray.is_initialized() or torch.cuda.is_available():
        pytest.skip("needs a machine without GPUs and no Ray running in this process")
    with pytest.raises(RankError, match=r"2 ranks x gpus_per_rank=1 need 2 GPUs, this machine has 0"):
        RankGroup(policy[0], tiny_model, LossConfig(), OptimConfig(**OPTIM),
                  DistributedConfig(num_ranks=2, gpus_per_rank=1), total_steps=1,
                  pad_token_id=policy[1].pad_token_id, log_dir=tmp_path)
    assert not ray.is_initialized()


# --- the update's equivalence with one rank ----------------------------------------------------


NO_TOKEN = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"ada", None, timeout=10)
except Exception as err:
    print(type(err).__name__, err)
else:
    print("ANSWERED")
"""


def _check_listeners_and_ray_auth(pids: dict[str, list[int]]) -> None:
    """The driver and both ranks listen beyond loopback only on their Ray core-worker ports (torch's
    rendezvous and gloo are on loopback); Ray's own servers, which Ray 2.60 binds to the node IP or
    every interface, refuse a request without the cluster's token (docs/ARCHITECTURE.md, Ports)."""
    import subprocess
    import sys

    import ray
    from support import listeners_beyond_loopback

    for pid in [os.getpid(), *pids["ranks"]]:
        outside = listeners_beyond_loopback(pid)
        assert len(outside) <= 1, (pid, outside)  # one gRPC server per Ray worker process, nothing else
    assert os.environ.get("RAY_AUTH_MODE") == "token"  # what Ray 2.60 turns on for a new local cluster
    from pathlib import Path

    assert Path.home().joinpath(".ray", "auth_token").stat().st_mode & 0o077 == 0  # Ray wrote it 0644
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # a client that sends no token
    env.pop("RAY_AUTH_TOKEN", None)
    answer = subprocess.run([sys.executable, "-c", NO_TOKEN, address], env=env, capture_output=True, text=True,
                            timeout=120)
    assert "ANSWERED" not in answer.stdout and "uthenticat" in answer.stdout + answer.stderr, answer


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray for the groups below, started as RankGroup starts it, stopped at the end."""
    import ray

    started = start_ray(DistributedConfig(num_ranks=4))  # room for two 2-rank groups at once
    yield
    if started:
        ray.shutdown()


def _batch(tokenizer, seed: int) -> list[Group]:
    """Three prompts whose samples have very unequal response lengths (1 to 7 tokens), so any split
    by whole prompts over 2 ranks gives the ranks different token counts."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [[7, 6, 7], [1, 2], [3, 1, 4, 2]]
    advantages = [[1.0, -0.5, 0.8], [-1.0, 1.0], [0.3, -0.2, 0.6, -0.9]]
    groups = []
    for g, (lens, advs) in enumerate(zip(lengths, advantages)):
        prompt = Prompt(id=f"q{g}", text=f"{g + 2}+{3 * g + 1}=", answer="0")
        prompt.prompt_ids = format_prompt_ids(tokenizer, prompt)
        samples = [Sample(prompt_id=prompt.id,
                          completion_ids=torch.randint(3, len(tokenizer), (n,), generator=generator).tolist(),
                          logprobs=[-2.0] * n, text="", truncated=n == 7) for n in lens]
        groups.append(Group(prompt=prompt, samples=samples, advantages=advs, pool_size=len(lens), pool_positives=1,
                            p_hat=0.5))
    return groups


@pytest.fixture(scope="module")
def groups_by_stage(ray_local, policy, tiny_model, tmp_path_factory):
    """A 2-rank group per ZeRO stage, built on first use and shared by the tests below."""
    _, tokenizer = policy
    built: dict[int, RankGroup] = {}

    def get(stage: int) -> RankGroup:
        if stage not in built:
            built[stage] = RankGroup(copy.deepcopy(policy[0]), tiny_model, LossConfig(),
                                     OptimConfig(**OPTIM, zero_stage=stage), TWO_RANKS, total_steps=10,
                                     pad_token_id=tokenizer.pad_token_id, seed=0, max_response_len=8,
                                     log_dir=tmp_path_factory.mktemp(f"ranks{stage}"))
        return built[stage]

    yield get
    for group in built.values():
        group.close()


def _per_rank_normalised_grad_norm(model, tokenizer, groups) -> tuple[float, float]:
    """The first step's gradient norm with the global token count, and as it would be if each of the
    two ranks divided by its own token count (DeepSpeed then averaging the rank gradients)."""
    seqs = flatten(groups)
    plan = plan_update(seqs, len(groups), torch.Generator().manual_seed(0), OptimConfig(**OPTIM), LossConfig(),
                       world_size=2, max_response_len=8)
    cfg = LossConfig()

    def grads(share, num_tokens):
        model.zero_grad()
        batch = collate([seqs[i] for i in share], tokenizer.pad_token_id)
        width = batch["response_ids"].shape[1]
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, -(width + 1):-1]
        logprobs = gather_logprobs(logits, batch["response_ids"])
        loss, _ = ppo_clip_loss(logprobs, logprobs.detach(), batch["advantages"], batch["mask"], cfg,
                                num_tokens=num_tokens, num_seqs=1.0, max_len=8)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    shares = plan[0].shares
    total = plan[0].denominators.num_tokens
    local = [float(sum(len(seqs[i]["completion"]) for i in s)) for s in shares]
    assert local[0] != local[1], "the batch must put unequal token counts on the two ranks"
    norm = lambda gs: float(torch.sqrt(sum((g ** 2).sum() for g in gs)))  # noqa: E731
    global_grads = [a + b for a, b in zip(grads(shares[0], total), grads(shares[1], total))]
    per_rank = [(a + b) / 2 for a, b in zip(grads(shares[0], local[0]), grads(shares[1], local[1]))]
    return norm(global_grads), norm(per_rank)


@pytest.mark.parametrize("stage", [0, 2])
def test_two_ranks_make_the_same_update_as_one(stage, groups_by_stage, policy):
    model, tokenizer = policy
    group = groups_by_stage(stage)
    single = DeepSpeedUpdateEngine(copy.deepcopy(model), LossConfig(), OptimConfig(**OPTIM, zero_stage=stage),
                                   total_steps=10, pad_token_id=tokenizer.pad_token_id, seed=0, max_response_len=8)
    assert group.optimizer_steps == 0
    expected_norm, per_rank_norm = _per_rank_normalised_grad_norm(copy.deepcopy(model), tokenizer, _batch(tokenizer, 0))
    for step in range(2):
        batch = _batch(tokenizer, seed=step)
        one, two = single.update(copy.deepcopy(batch)), group.update(copy.deepcopy(batch))
        assert two[K.DIST_WORLD_SIZE] == 2.0 and one[K.DIST_WORLD_SIZE] == 1.0
        for key in (K.TRAIN_LOSS, K.TRAIN_GRAD_NORM, K.TRAIN_ENTROPY, K.TRAIN_CLIP_FRAC, K.TRAIN_APPROX_KL):
            assert two[key] == pytest.approx(one[key], abs=1e-5), (step, key)
        if step == 0:
            # The group's first step is the global-denominator gradient, and per-rank normalisation
            # would have given a visibly different one.
            assert two[K.TRAIN_GRAD_NORM] == pytest.approx(expected_norm, rel=1e-4)
            assert abs(per_rank_norm - expected_norm) > 100 * 1e-5 + 1e-3 * expected_norm
    assert group.optimizer_steps == single.optimizer_steps == 2
    mine, theirs = single.module.state_dict(), group.module.state_dict()
    worst = max(float((mine[k] - theirs[k]).abs().max()) for k in mine)
    assert worst < 1e-5, f"parameters differ by {worst}"


def test_checkpoints_hold_every_ranks_state_and_refuse_another_world_size(groups_by_stage, policy, tmp_path):
    _, tokenizer = policy
    group = groups_by_stage(2)
    if group.optimizer_steps == 0:  # run alone: give the optimizer some state to save
        group.update(_batch(tokenizer, 0))
    steps = group.optimizer_steps
    group.save(tmp_path / "opt")
    shards = [torch.load(tmp_path / "opt" / f"rank_{r}" / "update_engine.pt", weights_only=True) for r in range(2)]
    assert all(s["world_size"] == 2 and s["zero_stage"] == 2 for s in shards)
    assert shards[0]["optimizer"] is not None and shards[1]["optimizer"] is not None
    single = DeepSpeedUpdateEngine(copy.deepcopy(policy[0]), LossConfig(), OptimConfig(**OPTIM, zero_stage=2),
                                   total_steps=10, pad_token_id=tokenizer.pad_token_id)
    with pytest.raises(ValueError, match=r"saved by 2 training rank\(s\), but distributed.num_ranks=1"):
        single.load(tmp_path / "opt")
    single.save(tmp_path / "one")
    with pytest.raises(ValueError, match=r"saved by 1 training rank\(s\), but distributed.num_ranks=2"):
        group.load(tmp_path / "one")
    group.load(tmp_path / "opt")  # its own state loads back
    assert group.optimizer_steps == steps


def test_rollout_across_ranks_equals_one_engine(groups_by_stage, policy):
    _, tokenizer = policy
    group = groups_by_stage(0)
    engine = group.rollout_engine()
    prompts = _batch(tokenizer, 0)
    requests = [(g.prompt, k) for g, k in zip(prompts, [3, 0, 5])]
    sampling = SamplingParams(max_tokens=6, seed=13)
    split = engine.generate(requests, sampling)
    local = TransformersRolloutEngine(group.module, tokenizer).generate(requests, sampling)
    assert [len(g) for g in split] == [3, 0, 5]
    assert [s.completion_ids for g in split for s in g] == [s.completion_ids for g in local for s in g]
    for a, b in zip([s for g in split for s in g], [s for g in local for s in g]):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        engine.generate([(Prompt(id="e", text="", answer=""), 1)], sampling)


def test_a_dead_rank_fails_the_step_naming_it(groups_by_stage, policy):
    """Last in the module: it kills a rank of the stage-2 group, which is then closed."""
    _, tokenizer = policy
    group = groups_by_stage(2)
    pids = group.process_ids()["ranks"]
    os.kill(pids[1], 9)
    assert _wait_gone([pids[1]]) == []
    with pytest.raises(RankError, match=r"(?s)training rank 1 on host \S+ died.*last \d+ lines of .*rank_1\.log") as died:
        group.update(_batch(tokenizer, 5))
    summary = died.value.summary  # the one line `ada train` prints (exit 1), not the traceback
    assert "\n" not in summary and f"training rank 1 on host {group.rank_hosts[1]} died" in summary
    assert summary.endswith(f"log: {group.log_dir / 'rank_1.log'}")
    group.close()
    assert _wait_gone(pids) == [], "a rank outlived close()"


