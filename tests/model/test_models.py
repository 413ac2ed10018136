"""Models: the tiny Llama and its tokenizer, SmolLM2's GGUF conversion, resolution, formatting, SFT."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from ada_core.data import generate_prompts
from ada_core.engines.transformers_engine import TransformersRolloutEngine
from ada_core.models import (
    build_tiny,
    build_tiny_tokenizer,
    encode_prompts,
    format_prompt_ids,
    load_policy,
    load_tokenizer,
    resolve_model,
    sft_warm_start,
    smollm2_gguf_path,
)
from ada_core.models.sft import _sft_tensors
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt
from ada_core.rl.rewards import MathVerifier

TEXTS = ["12+345=", "0+0=", "999+999=1998", " 7 - 3 = 4 ", "1+2=3+4=5"]


# --- the tiny model --------------------------------------------------------------------------


def test_tiny_tokenizer_reloads_with_identical_ids(tiny_model):
    saved = build_tiny_tokenizer()
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((tiny_model / "config.json").read_text())["model_type"] == "llama"
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tiny_model)
    for text in TEXTS:
        ids = saved.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids
        assert len(ids) == len(text)  # one token per character
        assert loaded.decode(ids) == text
    assert loaded.get_vocab() == saved.get_vocab() and len(loaded) == 18
    for name in ("bos", "eos", "pad", "unk"):
        assert getattr(loaded, f"{name}_token_id") == getattr(saved, f"{name}_token_id") is not None


def test_tiny_model_shape_and_seeded_init(tiny_model, tmp_path):
    model, tokenizer = load_policy(tiny_model)
    n_params = sum(p.numel() for p in model.parameters())
    assert 380_000 < n_params < 430_000  # DESIGN.md's ~400K calibration point
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (128, 2, 4)
    assert c.vocab_size == len(tokenizer) and c.eos_token_id == tokenizer.eos_token_id
    same = build_tiny(tmp_path / "again", seed=0)
    other = build_tiny(tmp_path / "other", seed=1)
    weights = {name: load_policy(d)[0].state_dict() for name, d in (("same", same), ("other", other))}
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights["same"][key])
    assert not torch.equal(model.state_dict()["lm_head.weight"], weights["other"]["lm_head.weight"])


def test_named_models_are_built_once(tiny_model):
    marker = tiny_model / "ada_model.json"
    before = marker.stat().st_mtime_ns
    assert resolve_model("tiny") == tiny_model
    assert build_tiny(tiny_model, seed=0) == tiny_model
    assert marker.stat().st_mtime_ns == before
    build_tiny(tiny_model.parent / "tiny-s3", seed=3)
    assert json.loads((tiny_model.parent / "tiny-s3" / "ada_model.json").read_text())["seed"] == 3


def test_resolve_model_errors_name_the_path(tmp_path, tiny_model):
    with pytest.raises(FileNotFoundError, match="'/no/such/model'.*not a built-in model name"):
        resolve_model("/no/such/model")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"{empty} has no config.json"):
        resolve_model(str(empty))
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    shutil.copy(tiny_model / "config.json", no_tok / "config.json")
    with pytest.raises(ValueError, match=f"{no_tok} has no tokenizer"):
        resolve_model(no_tok)
    with pytest.raises(ValueError, match="is a file"):
        resolve_model(tiny_model / "config.json")
    local = tmp_path / "local"
    shutil.copytree(tiny_model, local)
    assert resolve_model(str(local)) == local.resolve()  # any HF folder works


def test_tiny_prompt_formatting(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    assert not tokenizer.chat_template
    prompt = Prompt(id="p", text="12+345=", answer="357", meta={"answer_format": "plain"})
    ids = format_prompt_ids(tokenizer, prompt)
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids[1:]) == "12+345=" and len(ids) == 8
    encode_prompts(tokenizer, [prompt])
    assert prompt.prompt_ids == ids
    with pytest.raises(ValueError, match="prompt q: text 'What is 2\\+2\\?' has characters"):
        format_prompt_ids(tokenizer, Prompt(id="q", text="What is 2+2?", answer="4"))


# --- SFT warm start --------------------------------------------------------------------------


def test_sft_labels_cover_answer_and_eos_only(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    prompts = [Prompt(id="a", text="12+3=", answer="15", meta={"answer_format": "plain"}),
               Prompt(id="b", text="1+1=", answer="2", meta={"answer_format": "plain"})]
    ids, labels, attention = _sft_tensors(tokenizer, prompts)
    assert tokenizer.decode(ids[0].tolist()) == "<bos>12+3=15<eos>"
    assert labels[0].tolist()[:6] == [-100] * 6
    assert tokenizer.decode(labels[0, 6:].tolist()) == "15<eos>"
    assert attention[1].tolist() == [1] * 7 + [0] * 2  # right-padded to the longest row
    assert labels[1].tolist()[-1] == -100 and ids[1, -1] == tokenizer.pad_token_id


@pytest.fixture(scope="session")
def one_digit_sft(tiny_model):
    """The tiny model after a short SFT on all 100 one-digit sums (built once per session)."""
    prompts = generate_prompts("arithmetic", 100, seed=0, difficulty=1)
    return sft_warm_start(tiny_model, prompts, steps=150, batch_size=64, seed=0), prompts


def test_sft_learns_and_is_cached(one_digit_sft, tiny_model):
    folder, prompts = one_digit_sft
    info = json.loads((folder / "sft.json").read_text())
    assert info["steps"] == 150 and info["final_loss"] < 0.5  # ~2.9 at initialisation
    model, tokenizer = load_policy(folder)
    encode_prompts(tokenizer, prompts)
    samples = TransformersRolloutEngine(model, tokenizer).generate(
        [(p, 4) for p in prompts], SamplingParams(temperature=1.0, max_tokens=6, seed=0))
    with MathVerifier() as verifier:
        verdicts = verifier.verify([(p, s.text) for p, group in zip(prompts, samples) for s in group])
    pass_rate = sum(v.reward for v in verdicts) / len(verdicts)
    assert pass_rate > 0.3, pass_rate  # the random init scores ~0
    # Same inputs reuse the folder without training; other inputs get their own.
    marker = (folder / "ada_model.json").stat().st_mtime_ns
    assert sft_warm_start(tiny_model, prompts, steps=150, batch_size=64, seed=0) == folder
    assert (folder / "ada_model.json").stat().st_mtime_ns == marker
    other = sft_warm_start(tiny_model, prompts[:50], steps=2, batch_size=64, seed=0)
    assert other != folder and json.loads((other / "sft.json").read_text())["prompts"] == 50


def test_the_sft_section_reaches_the_warm_start(tiny_model):
    """`sft.lr` and `sft.batch_size` are what the warm start trains with: recorded, and other weights."""
    from ada_core.models import weights_sha256
    from ada_core.training.start import start_model

    folders = [start_model(str(tiny_model), 3, "arithmetic", [], 0, sft=sft)[0]
               for sft in ({}, {"lr": 1e-3}, {"batch_size": 16})]
    infos = [json.loads((f / "sft.json").read_text()) for f in folders]
    assert [(i["lr"], i["batch_size"]) for i in infos] == [(2e-3, 128), (1e-3, 128), (2e-3, 16)]
    assert len({weights_sha256(f) for f in folders}) == 3


def test_sft_into_chosen_folder_and_bad_args(tiny_model, tmp_path):
    prompts = generate_prompts("arithmetic", 8, seed=0)
    out = sft_warm_start(tiny_model, prompts, steps=2, batch_size=4, seed=1, out_dir=tmp_path / "warm")
    assert out == tmp_path / "warm" and (out / "model.safetensors").is_file()
    assert load_tokenizer(out).get_vocab() == load_tokenizer(tiny_model).get_vocab()
    assert torch.get_num_threads() >= 1
    with pytest.raises(ValueError, match="steps must be >= 1"):
        sft_warm_start(tiny_model, prompts, steps=0)
    with pytest.raises(ValueError, match="at least one prompt"):
        sft_warm_start(tiny_model, [], steps=1)


def test_sft_restores_torch_threads(tiny_model):
    before = torch.get_num_threads()
    sft_warm_start(tiny_model, generate_prompts("arithmetic", 4, seed=9), steps=1, batch_size=4, num_threads=1)
    assert torch.get_num_threads() == before


# --- SmolLM2-135M from its GGUF wheel --------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2(ada_home):
    return resolve_model("smollm2-135m")


@pytest.mark.slow
def test_smollm2_conversion_is_faithful_and_reused(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (smollm2 / "model.safetensors").is_file()
    assert json.loads((smollm2 / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    marker = (smollm2 / "ada_model.json").stat().st_mtime_ns
    assert resolve_model("smollm2-135m") == smollm2 and (smollm2 / "ada_model.json").stat().st_mtime_ns == marker

    model, tokenizer = load_policy(smollm2)
    prompt = Prompt(id="q", text="What is 2+3?", answer="5")
    ids = format_prompt_ids(tokenizer, prompt)
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n") and "What is 2+3?\nPut your final answer within \\boxed{}." in text

    # Posed as a chat turn that asks for \boxed{}, arithmetic's plain answers become boxed ones.
    arithmetic = Prompt(id="a", text="2+3=", answer="5", meta={"answer_format": "plain"})
    encode_prompts(tokenizer, [arithmetic])
    assert arithmetic.meta["answer_format"] == "boxed" and arithmetic.prompt_ids[-3:] == ids[-3:]
    sft_ids, sft_labels, _ = _sft_tensors(tokenizer, [arithmetic])
    assert tokenizer.decode([t for t in sft_labels[0].tolist() if t != -100]) == "\\boxed{5}<|im_end|>"

    gguf = smollm2_gguf_path()
    gguf_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert gguf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?\nPut your final answer within \\boxed{}."}],
        add_generation_prompt=True, tokenize=True, return_dict=False) == ids
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    with torch.inference_mode():
        got, want = (m(torch.tensor([ids])).logits for m in (model, reference))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)

    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
