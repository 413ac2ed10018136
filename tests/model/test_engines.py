"""The rollout engine and the DeepSpeed update engine on the real tiny Llama (models.build_tiny), on CPU."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from ada_core import metrics as K
from ada_core.config import LossConfig, OptimConfig
from ada_core.engines.transformers_engine import TransformersRolloutEngine
from ada_core.models import build_tiny, format_prompt_ids, load_policy
from ada_core.protocols import RolloutEngine, SamplingParams
from ada_core.records import Group, Prompt


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model gains nothing from intra-op threads, and on a shared 2-core machine OpenMP
    contention made these tests ~20x slower with 2 threads than with 1."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tokenizer = load_policy(build_tiny(tmp_path_factory.mktemp("models") / "tiny", seed=0))
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer = tiny
    out = [Prompt(id=f"p{i}", text=f"{i}+{3 * i + 7}=", answer=str(4 * i + 7), meta={"answer_format": "plain"})
           for i in range(12)]
    for p in out:
        p.prompt_ids = format_prompt_ids(tokenizer, p)
    return out


def _full_forward_logprobs(model, prompt_ids, completion_ids, temperature=1.0):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1)


# --- rollout ----------------------------------------------------------------------------------


def test_generate_returns_k_unscored_samples_per_request_in_order(tiny, prompts):
    model, tokenizer = tiny
    engine = TransformersRolloutEngine(model, tokenizer, micro_batch_size=5)
    assert isinstance(engine, RolloutEngine)
    ks = [3, 0, 1, 4] * 3
    out = engine.generate(list(zip(prompts, ks)), SamplingParams(max_tokens=6, seed=1))
    assert [len(group) for group in out] == ks
    eos = tokenizer.eos_token_id
    ended = truncated = 0
    for prompt, group in zip(prompts, out):
        for s in group:
            assert s.prompt_id == prompt.id and s.reward is None
            assert 1 <= len(s.completion_ids) <= 6 and len(s.logprobs) == len(s.completion_ids)
            assert all(lp <= 0 for lp in s.logprobs)
            assert eos not in s.completion_ids[:-1], "generation continued past EOS"
            if s.completion_ids[-1] == eos:  # EOS kept in the ids (the policy learns to stop) ...
                assert not s.truncated
                ended += 1
            else:  # ... and a row without EOS ran out of tokens
                assert s.truncated and len(s.completion_ids) == 6
                truncated += 1
            assert s.text == tokenizer.decode(s.completion_ids, skip_special_tokens=True)
            assert "<eos>" not in s.text
    assert ended and truncated, "the seeded draw should contain both endings"


def test_always_eos_model_gives_one_token_empty_text(tiny, prompts):
    model, tokenizer = tiny
    stopper = copy.deepcopy(model)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 50.0  # eos logit dwarfs every other one
    stopper.lm_head = head
    out = TransformersRolloutEngine(stopper, tokenizer).generate([(prompts[0], 2)], SamplingParams(seed=0))
    for s in out[0]:
        assert s.completion_ids == [tokenizer.eos_token_id] and s.text == "" and not s.truncated


def test_same_seed_same_samples_whatever_the_micro_batch(tiny, prompts):
    model, tokenizer = tiny
    requests = [(p, 3) for p in prompts]
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=7)
    a = TransformersRolloutEngine(model, tokenizer, micro_batch_size=64).generate(requests, sampling)
    b = TransformersRolloutEngine(model, tokenizer, micro_batch_size=4).generate(requests, sampling)
    c = TransformersRolloutEngine(model, tokenizer, micro_batch_size=64).generate(requests, SamplingParams(
        temperature=1.0, max_tokens=6, seed=8))
    ids = lambda out: [s.completion_ids for group in out for s in group]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    for ga, gb in zip(a, b):
        for sa, sb in zip(ga, gb):
            assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-5)
    # Copy j of a request does not depend on how many copies were asked for.
    fewer = TransformersRolloutEngine(model, tokenizer).generate([(p, 1) for p in prompts], sampling)
    assert [g[0].completion_ids for g in fewer] == [g[0].completion_ids for g in a]


def test_a_prefix_computed_once_for_the_rows_that_share_it_gives_the_samples_of_one_computation_per_row(
        tiny, prompts):
    """Rows that share a prefix (a prompt's copies, and while they draw the same tokens) share its forward and
    cache: the same samples as computing every row, with groups split across micro-batches, a prompt repeated
    in two requests, prompts of several lengths, a stop string and top-p; and fewer rows reach the model."""
    model, tokenizer = tiny
    requests = [(p, k) for p, k in zip(prompts, [3, 1, 4, 0, 2, 5] * 2)] + [(prompts[0], 2), (prompts[5], 3)]
    assert len({len(p.prompt_ids) for p, _ in requests}) > 1
    rows_read = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: rows_read.append(kwargs["input_ids"].numel()),
                                           with_kwargs=True)
    try:
        for sampling in (SamplingParams(temperature=1.0, max_tokens=6, seed=7),
                         SamplingParams(temperature=0.3, max_tokens=6, seed=2),
                         SamplingParams(temperature=1.3, top_p=0.8, max_tokens=8, seed=5, stop=("=",))):
            for micro_batch_size in (64, 5):
                rows_read.clear()
                shared = TransformersRolloutEngine(model, tokenizer, micro_batch_size).generate(requests, sampling)
                shared_rows = sum(rows_read)
                rows_read.clear()
                per_row = TransformersRolloutEngine(model, tokenizer, micro_batch_size,
                                                    share_prefixes=False).generate(requests, sampling)
                assert [[(s.completion_ids, s.text, s.truncated) for s in g] for g in shared] == \
                    [[(s.completion_ids, s.text, s.truncated) for s in g] for g in per_row]
                for ga, gb in zip(shared, per_row):
                    for sa, sb in zip(ga, gb):
                        assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-5)
                assert shared_rows < sum(rows_read)
    finally:
        hook.remove()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_behaviour_logprobs_are_temperature_scaled_without_top_p_renormalisation(tiny, prompts, temperature, top_p):
    model, tokenizer = tiny
    engine = TransformersRolloutEngine(model, tokenizer, micro_batch_size=8)
    out = engine.generate([(p, 2) for p in prompts[:6]], SamplingParams(temperature, top_p, max_tokens=5, seed=3))
    for prompt, group in zip(prompts, out):
        for s in group:
            expected = _full_forward_logprobs(model, prompt.prompt_ids, s.completion_ids, temperature)
            assert torch.allclose(torch.tensor(s.logprobs), expected, atol=1e-4)


def test_stop_string_truncates_text_and_ids(tiny, prompts):
    model, tokenizer = tiny
    engine = TransformersRolloutEngine(model, tokenizer)
    plain = engine.generate([(p, 4) for p in prompts], SamplingParams(max_tokens=8, seed=5))
    stopped = engine.generate([(p, 4) for p in prompts], SamplingParams(max_tokens=8, seed=5, stop=("=",)))
    hits = 0
    for group_plain, group_stop in zip(plain, stopped):
        for a, b in zip(group_plain, group_stop):
            assert "=" not in b.text
            assert a.completion_ids[: len(b.completion_ids)] == b.completion_ids  # same draw, cut short
            if "=" in a.text:
                hits += 1
                assert b.text == a.text[: a.text.index("=")]
                assert tokenizer.decode(b.completion_ids[-1:]) == "=" and not b.truncated
    assert hits > 0, "the seeded draw should hit the stop string"


def test_generate_rejects_bad_input_and_restores_train_mode(tiny, prompts):
    model, tokenizer = tiny
    engine = TransformersRolloutEngine(model, tokenizer)
    with pytest.raises(ValueError, match="prompt empty-one: prompt_ids is empty"):
        engine.generate([(Prompt(id="empty-one", text="1+1=", answer="2"), 1)], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([(prompts[0], 1)], SamplingParams(temperature=0.0))
    model.train()
    try:
        engine.generate([(prompts[0], 1)], SamplingParams(max_tokens=2, seed=0))
        assert model.training
    finally:
        model.eval()


# --- update -----------------------------------------------------------------------------------

OPTIM = dict(lr=1e-3, warmup_steps=0, mini_batches=1, micro_batch_size=16)


@pytest.fixture(scope="module")
def make_updater(tiny):
    """Build update engines on copies of the tiny model. The first pays DeepSpeed's import and
    process-group set-up; later ones reuse the process group and take well under a second."""
    from ada_core.engines.deepspeed_engine import DeepSpeedUpdateEngine

    model, tokenizer = tiny

    def make(loss=None, weights=None, ref_model=None, temperature=1.0, **optim):
        policy = copy.deepcopy(model)
        if weights is not None:
            policy.load_state_dict(weights)
        return DeepSpeedUpdateEngine(policy, loss or LossConfig(), OptimConfig(**{**OPTIM, **optim}),
                                     total_steps=10, pad_token_id=tokenizer.pad_token_id, ref_model=ref_model, seed=0,
                                     temperature=temperature)

    return make


def stepped_gradients(**updaters) -> dict[str, list[torch.Tensor]]:
    """name -> the gradient each named updater's optimizer steps on (after accumulation and clipping), filled at
    its next step. Weights after one Adam step would amplify float noise on near-zero gradients, since Adam's
    first step is ~lr*sign(g)."""
    grads: dict[str, list[torch.Tensor]] = {}
    for name, updater in updaters.items():
        updater.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, name=name: grads.__setitem__(
                name, [p.grad.clone() for g in opt.param_groups for p in g["params"]]))
    return grads


def _groups(updater, tokenizer, prompts, seed, advantages=(1.0, -1.0, 0.5, -0.5), temperature=1.0):
    rollout = TransformersRolloutEngine(updater.module, tokenizer)
    sampling = SamplingParams(temperature, max_tokens=6, seed=seed)
    out = rollout.generate([(p, len(advantages)) for p in prompts], sampling)
    return [Group(prompt=p, samples=s, advantages=list(advantages), pool_size=len(s), pool_positives=2, p_hat=0.5)
            for p, s in zip(prompts, out)]


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _seq_logprob(model, groups):
    total = 0.0
    for g in groups:
        for s in g.samples:
            total += float(_full_forward_logprobs(model, g.prompt.prompt_ids, s.completion_ids).sum())
    return total


def test_updates_give_finite_metrics_and_change_the_shared_weights(make_updater, tiny, prompts):
    _, tokenizer = tiny
    updater = make_updater(mini_batches=2)
    rollout = TransformersRolloutEngine(updater.module, tokenizer)
    before = _weights(updater.module)
    probe = rollout.generate([(prompts[0], 1)], SamplingParams(max_tokens=4, seed=0))[0][0]
    for step in range(3):
        metrics = updater.update(_groups(updater, tokenizer, prompts, seed=step))
        assert set(metrics) >= {K.TRAIN_LOSS, K.TRAIN_ENTROPY, K.TRAIN_CLIP_FRAC, K.TRAIN_APPROX_KL,
                                K.TRAIN_GRAD_NORM, K.TRAIN_LR, K.TRAIN_KL_REF, K.UPDATE_OLD_LOGPROB_GAP_MEAN,
                                K.UPDATE_OLD_LOGPROB_GAP_MAX, K.UPDATE_IS_RATIO_MEAN, K.UPDATE_IS_RATIO_MAX}
        assert K.UPDATE_TIS_CLIP_FRAC not in metrics  # only logged when loss.tis_cap is on
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
        K.check_keys(metrics)
        assert metrics[K.UPDATE_OPTIMIZER_STEPS] == 2.0 and metrics[K.TRAIN_GRAD_NORM] > 0
        assert 0 < metrics[K.TRAIN_ENTROPY] <= math.log(len(tokenizer)) + 1e-4
    assert updater.optimizer_steps == 6
    after = _weights(updater.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())
    # The rollout engine holds the same model object: it samples from the new weights at once.
    again = rollout.generate([(prompts[0], 1)], SamplingParams(max_tokens=4, seed=0))[0][0]
    assert again.completion_ids != probe.completion_ids or again.logprobs != pytest.approx(probe.logprobs, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("mini_batches", [1, 2])
def test_first_minibatch_ratio_is_one(make_updater, tiny, prompts, temperature, mini_batches):
    _, tokenizer = tiny
    updater = make_updater(mini_batches=mini_batches, temperature=temperature)
    metrics = updater.update(_groups(updater, tokenizer, prompts, seed=11, temperature=temperature))
    # Old log-probs at the sampling temperature, as the engine reports them: recomputed (two optimizer steps)
    # or the one step's own (one).
    assert metrics[K.UPDATE_OLD_RECOMPUTED] == (1.0 if mini_batches > 1 else 0.0)
    assert metrics[K.UPDATE_OLD_LOGPROB_GAP_MEAN] < 1e-4
    assert metrics[K.UPDATE_OLD_LOGPROB_GAP_MAX] < 1e-4
    assert metrics[K.UPDATE_IS_RATIO_MEAN] == pytest.approx(1.0, abs=1e-4)
    assert metrics[K.UPDATE_IS_RATIO_MAX] == pytest.approx(1.0, abs=1e-4)
    if mini_batches == 1:
        assert metrics[K.TRAIN_APPROX_KL] == 0.0 and metrics[K.TRAIN_CLIP_FRAC] == 0.0
    else:  # the second step's policy moved: its ratios leave 1
        assert metrics[K.TRAIN_APPROX_KL] > 0.0


def test_one_optimizer_step_takes_the_gradient_of_the_recomputed_old_policy(make_updater, tiny, prompts):
    """An update of one optimizer step skips the no-grad forward for the old log-probs (its own, detached, are
    the old policy's): the gradient it steps on is the one the recomputed old log-probs give."""
    from ada_core.engines.update_plan import flatten, local_steps, plan_update

    _, tokenizer = tiny
    skip, recompute = make_updater(micro_batch_size=5), make_updater(micro_batch_size=5)
    grads = stepped_gradients(skip=skip, recompute=recompute)
    groups = _groups(skip, tokenizer, prompts, seed=41)
    metrics = skip.update(groups)
    assert metrics[K.UPDATE_OLD_RECOMPUTED] == 0.0

    seqs = flatten(groups)  # the path an update of several steps takes, on the same one-step plan
    plan = plan_update(seqs, len(groups), recompute._shuffle, recompute.optim_cfg, recompute.loss_cfg, world_size=1,
                       max_response_len=recompute.max_response_len)
    assert len(plan) == 1
    recompute.recompute(seqs)
    assert all(s["old"] is not None for s in seqs)
    recompute.train_steps(local_steps(seqs, plan, rank=0))
    assert len(grads["skip"]) == len(grads["recompute"]) > 0
    for a, b in zip(grads["skip"], grads["recompute"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="old_is_current needs an update of one optimizer step, not 2"):
        skip.train_steps(local_steps(seqs, plan, rank=0) * 2, old_is_current=True)


def test_positive_advantage_raises_logprob_of_those_completions(make_updater, tiny, prompts):
    _, tokenizer = tiny
    updater = make_updater(lr=3e-3)
    groups = _groups(updater, tokenizer, prompts, seed=21, advantages=(1.0, 1.0))
    before = _seq_logprob(updater.module, groups)
    updater.update(groups)
    assert _seq_logprob(updater.module, groups) > before + 0.1


def test_gradient_accumulation_matches_one_big_micro_batch(make_updater, tiny, prompts):
    _, tokenizer = tiny
    big, small = make_updater(micro_batch_size=64), make_updater(micro_batch_size=5)
    grads = stepped_gradients(big=big, small=small)
    groups = _groups(big, tokenizer, prompts, seed=31)
    m_big, m_small = big.update(groups), small.update(groups)
    assert m_small[K.TRAIN_LOSS] == pytest.approx(m_big[K.TRAIN_LOSS], abs=1e-5)
    assert m_small[K.TRAIN_GRAD_NORM] == pytest.approx(m_big[K.TRAIN_GRAD_NORM], rel=1e-4)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(grads["big"], grads["small"]))


@pytest.mark.parametrize("temperature,kl", [(1.0, 0.0), (0.7, 0.1)])
def test_a_prompt_and_a_repeated_sequence_read_once_give_the_update_of_one_read_per_row(make_updater, tiny, prompts,
                                                                                        temperature, kl):
    """`optim.share_prompts`: each micro-batch reads a prompt once, its rows decode on that cache, and a sequence
    two of its rows repeat (a group's samples with the same answer, at other advantages) is read once. The loss,
    the gradient and the reference's log-probs are those of one read per row, within float noise, with groups
    split across micro-batches, prompts of several lengths and an update of two optimizer steps (old log-probs
    recomputed). (Weights after the steps are not compared: Adam's first step, ~lr * sign(g), turns float noise
    on a near-zero gradient into a full step.)"""
    model, tokenizer = tiny
    ref = copy.deepcopy(model) if kl else None
    loss = LossConfig(kl_coef=kl)
    shared = make_updater(loss=loss, ref_model=ref, temperature=temperature, micro_batch_size=6, mini_batches=2)
    per_row = make_updater(loss=loss, ref_model=copy.deepcopy(ref) if kl else None, temperature=temperature,
                           micro_batch_size=6, mini_batches=2, share_prompts=False)
    grads = stepped_gradients(shared=shared, per_row=per_row)
    read = {"shared": [], "per_row": []}  # the [rows, positions] the policy's embedding was given, per forward
    for name, updater in (("shared", shared), ("per_row", per_row)):
        updater.module.get_input_embeddings().register_forward_pre_hook(
            lambda _module, args, name=name: read[name].append(tuple(args[0].shape)))
    groups = _groups(shared, tokenizer, prompts, seed=51, temperature=temperature)
    for g in groups[::2]:  # the third sample repeats the first (its advantage stays its own)
        g.samples[2] = dataclasses.replace(g.samples[0])
    assert len({len(g.prompt.prompt_ids) for g in groups}) > 1
    read.update(shared=[], per_row=[])
    m_shared, m_row = shared.update(groups), per_row.update(groups)
    tokens = {name: sum(rows * width for rows, width in shapes) for name, shapes in read.items()}
    assert 0 < tokens["shared"] < 0.8 * tokens["per_row"]  # the prompts were read once per micro-batch, not per row
    # shared: a forward of a micro-batch's distinct prompts, then one of its distinct sequences' responses
    responses = sum(rows for rows, _ in read["shared"][1::2])
    assert responses < sum(rows for rows, _ in read["per_row"])  # the repeats within a micro-batch read once
    assert m_shared[K.UPDATE_OLD_RECOMPUTED] == 1.0
    for key in (K.TRAIN_LOSS, K.TRAIN_GRAD_NORM):
        assert m_shared[key] == pytest.approx(m_row[key], rel=1e-4, abs=1e-6), key
    assert len(grads["shared"]) == len(grads["per_row"]) > 0
    for a, b in zip(grads["shared"], grads["per_row"]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in shared.module.state_dict().items())  # stepped


def test_zero_stage_2_matches_stage_0(make_updater, tiny, prompts):
    _, tokenizer = tiny
    stage0, stage2 = make_updater(micro_batch_size=8), make_updater(micro_batch_size=8, zero_stage=2)
    groups = _groups(stage0, tokenizer, prompts, seed=41)
    m0, m2 = stage0.update(groups), stage2.update(groups)
    assert m2[K.TRAIN_GRAD_NORM] == pytest.approx(m0[K.TRAIN_GRAD_NORM], rel=1e-4)
    w0, w2 = _weights(stage0.module), _weights(stage2.module)
    assert all(torch.allclose(w0[k], w2[k], atol=1e-6) for k in w0)


def test_warmup_then_constant_lr_and_empty_update(make_updater, tiny, prompts):
    _, tokenizer = tiny
    updater = make_updater(lr=1e-3, warmup_steps=4)
    groups = _groups(updater, tokenizer, prompts[:4], seed=51)
    lrs = [updater.update(groups)[K.TRAIN_LR] for _ in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    before = _weights(updater.module)
    empty = updater.update([])
    assert empty[K.TRAIN_LOSS] == 0.0 and empty[K.UPDATE_OPTIMIZER_STEPS] == 0.0
    assert updater.optimizer_steps == 5
    assert all(torch.equal(before[k], v) for k, v in _weights(updater.module).items())


def test_weight_decay_shrinks_matrices_only(make_updater, tiny, prompts):
    _, tokenizer = tiny
    updater = make_updater(lr=1e-2, weight_decay=0.5)
    groups = _groups(updater, tokenizer, prompts[:4], seed=61, advantages=(0.0, 0.0))  # no policy gradient
    before = _weights(updater.module)
    updater.update(groups)
    for name, value in _weights(updater.module).items():
        factor = 1 - 1e-2 * 0.5 if value.ndim >= 2 else 1.0
        assert torch.allclose(value, before[name] * factor, atol=1e-7), name


def test_kl_to_reference_is_zero_then_grows(make_updater, tiny, prompts):
    model, tokenizer = tiny
    ref = copy.deepcopy(model)
    updater = make_updater(loss=LossConfig(kl_coef=0.1), ref_model=ref, lr=3e-3)
    first = updater.update(_groups(updater, tokenizer, prompts, seed=71))
    assert first[K.TRAIN_KL_REF] < 1e-9
    second = updater.update(_groups(updater, tokenizer, prompts, seed=72))
    assert second[K.TRAIN_KL_REF] > 1e-5


def test_the_reference_follows_the_engine_and_is_never_silently_missing(make_updater, tiny):
    model, _ = tiny
    updater = make_updater(loss=LossConfig(kl_coef=0.1), ref_model=copy.deepcopy(model), precision="bf16")
    ref = next(updater.ref_model.parameters())
    # On the engine's device (CUDA when there is one) and in the policy's dtype, frozen.
    assert ref.device == next(updater.module.parameters()).device == torch.device(updater.engine.device)
    assert ref.dtype == next(updater.module.parameters()).dtype == torch.bfloat16 and not ref.requires_grad
    with pytest.raises(ValueError, match="kl_coef=0.1 needs a reference model"):
        make_updater(loss=LossConfig(kl_coef=0.1))


def test_save_load_round_trips_optimizer_and_resumes_identically(make_updater, tiny, prompts, tmp_path):
    _, tokenizer = tiny
    a = make_updater(mini_batches=2, warmup_steps=3)
    a.update(_groups(a, tokenizer, prompts, seed=81))
    a.save(tmp_path / "opt")
    weights = _weights(a.module)
    b = make_updater(mini_batches=2, warmup_steps=3, weights=weights)
    b.load(tmp_path / "opt")
    assert b.optimizer_steps == a.optimizer_steps == 2
    state_a, state_b = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for k in state_a:
        assert all(torch.equal(state_a[k][n], state_b[k][n]) for n in ("exp_avg", "exp_avg_sq", "step"))
    groups = _groups(a, tokenizer, prompts, seed=82)
    ma, mb = a.update(groups), b.update(groups)
    assert ma[K.TRAIN_LR] == mb[K.TRAIN_LR] == pytest.approx(1e-3)
    wa, wb = _weights(a.module), _weights(b.module)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    saved = torch.load(tmp_path / "opt" / "update_engine.pt", weights_only=True)
    torch.save({**saved, "zero_stage": 2}, tmp_path / "opt" / "update_engine.pt")
    with pytest.raises(ValueError, match="saved with ZeRO stage 2"):
        b.load(tmp_path / "opt")


def test_update_rejects_bad_groups_and_zero_3(make_updater, tiny, prompts):
    _, tokenizer = tiny
    updater = make_updater()
    group = _groups(updater, tokenizer, prompts[:1], seed=91)[0]
    group.advantages = group.advantages[:-1]
    with pytest.raises(ValueError, match=f"prompt {prompts[0].id}: 4 samples but 3 advantages"):
        updater.update([group])
    with pytest.raises(ValueError, match=r"zero_stage\s+Input should be 0, 1 or 2"):  # the schema refuses it now
        make_updater(zero_stage=3)


def test_off_policy_metrics_and_tis_see_a_shifted_behaviour_policy(make_updater, tiny, prompts):
    # Behaviour log-probs 0.5 below the trainer's (as if a rollout server disagreed): every token's
    # importance ratio is e^0.5 ~ 1.65. With tis_cap 1.2 every weight is capped, so at the first
    # mini-batch (PPO ratio 1) the loss is exactly 1.2x the uncorrected one.
    _, tokenizer = tiny
    plain, corrected = make_updater(), make_updater(loss=LossConfig(tis_cap=1.2))
    groups = _groups(plain, tokenizer, prompts, seed=101, advantages=(1.0, 0.5))
    for g in groups:
        for s in g.samples:
            s.logprobs = [lp - 0.5 for lp in s.logprobs]
    m_plain, m_tis = plain.update(copy.deepcopy(groups)), corrected.update(copy.deepcopy(groups))
    for m in (m_plain, m_tis):
        K.check_keys(m)
        assert m[K.UPDATE_OLD_LOGPROB_GAP_MEAN] == pytest.approx(0.5, abs=1e-4)
        assert m[K.UPDATE_OLD_LOGPROB_GAP_MAX] == pytest.approx(0.5, abs=1e-4)
        assert m[K.UPDATE_IS_RATIO_MEAN] == pytest.approx(math.exp(0.5), rel=1e-4)
        assert m[K.UPDATE_IS_RATIO_MAX] == pytest.approx(math.exp(0.5), rel=1e-4)
    assert K.UPDATE_TIS_CLIP_FRAC not in m_plain and m_tis[K.UPDATE_TIS_CLIP_FRAC] == 1.0
    assert m_plain[K.TRAIN_LOSS] < -0.1
    assert m_tis[K.TRAIN_LOSS] == pytest.approx(1.2 * m_plain[K.TRAIN_LOSS], rel=1e-4)
    assert corrected.update([])[K.UPDATE_TIS_CLIP_FRAC] == 0.0


def test_bf16_zero_2_update_on_cpu_and_resume(make_updater, tiny, prompts, tmp_path):
    # DeepSpeed's bf16 mode runs on its CPU accelerator: the shared model is cast to bf16 (the
    # rollout engine samples from it), the optimizer keeps fp32 master weights, which save/load restores.
    _, tokenizer = tiny
    a = make_updater(zero_stage=2, precision="bf16", mini_batches=2)
    assert all(p.dtype == torch.bfloat16 for p in a.module.parameters())
    before = _weights(a.module)
    metrics = a.update(_groups(a, tokenizer, prompts, seed=111))
    assert all(math.isfinite(v) for v in metrics.values()) and metrics[K.TRAIN_GRAD_NORM] > 0
    # bf16 KV-cache sampling vs a bf16 full forward: the guard metrics report their gap, which is small.
    # Whether it is exactly 0 depends on the CPU's bf16 kernels (with avx512_bf16 the two paths can agree
    # bit for bit), so only its range is asserted; the shifted-behaviour test shows the metric sees a gap.
    for key in (K.UPDATE_OLD_LOGPROB_GAP_MEAN, K.UPDATE_OLD_LOGPROB_GAP_MAX):
        assert 0 <= metrics[key] < 0.1, (key, metrics[key])
    assert metrics[K.UPDATE_OLD_LOGPROB_GAP_MEAN] <= metrics[K.UPDATE_OLD_LOGPROB_GAP_MAX]
    after = _weights(a.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())
    a.save(tmp_path / "opt")
    # DeepSpeed's ZeRO/bf16 optimizer state is saved as tensors and plain values only.
    assert torch.load(tmp_path / "opt" / "update_engine.pt", weights_only=True)["optimizer"]
    b = make_updater(zero_stage=2, precision="bf16", mini_batches=2, weights=after)
    b.load(tmp_path / "opt")
    groups = _groups(a, tokenizer, prompts, seed=112)
    a.update(groups)
    b.update(groups)
    wa, wb = _weights(a.module), _weights(b.module)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    with pytest.raises(ValueError, match="saved with precision bf16, but optim.precision=fp32"):
        make_updater(zero_stage=2).load(tmp_path / "opt")




class _Payload:
    """Unpickling this runs code: it creates `path`."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def test_a_state_file_with_python_objects_is_refused_not_unpickled(make_updater, tmp_path):
    from ada_core.engines.update_state import UnsafeStateError
    from ada_core.errors import InputError

    updater = make_updater()
    updater.save(tmp_path / "opt")
    marker = tmp_path / "code-ran"
    path = tmp_path / "opt" / "update_engine.pt"
    torch.save({**torch.load(path, weights_only=True), "optimizer": _Payload(marker)}, path)
    with pytest.raises(UnsafeStateError, match="update_engine.pt holds Python objects") as err:
        updater.load(tmp_path / "opt")
    assert isinstance(err.value, InputError) and not marker.exists()
