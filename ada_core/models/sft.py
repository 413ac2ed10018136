"""The SFT warm start: a short supervised run on a separate prompt draw, cached by its inputs under
`ADA_HOME/cache/sft/`, so RL starts from a model that emits well-formed answers.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ada_core.paths import cache_dir
from ada_core.models.build import (BUILD_VERSION, atomic_build, built_once, folder_fingerprint, resolve_model,
                                   save_tokenizer)
from ada_core.models.policy import answer_target, format_prompt_ids, load_policy
from ada_core.records import Prompt


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
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Supervised warm start on prompt + answer + eos, with the loss on the answer and eos tokens.

    Batches are drawn from seeded epoch permutations; plain AdamW at a constant lr (3e-3 stalls
    the tiny model). Cached: the output folder records a key hashed from the model folder's
    contents, the arguments and the prompts, so the same inputs reuse the saved folder (default
    `ADA_HOME/cache/sft/<key>`). `num_threads` caps torch's threads while training (restored after):
    the tiny model's steps are too small to share, and on a busy 2-core machine two threads ran
    7x slower than one (docs/benchmarks/models.md). None keeps torch's setting.
    `progress(done, total)` is called after each step (not on a cache hit).

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
    marker = {"name": "sft", "key": key, "version": BUILD_VERSION}

    def train() -> Path:
        threads = torch.get_num_threads()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        try:
            return _train_sft(base, prompts, steps, batch_size, lr, seed, out, marker, progress)
        finally:
            torch.set_num_threads(threads)

    return built_once(out, marker, train)


def _train_sft(base: Path, prompts: list[Prompt], steps: int, batch_size: int, lr: float, seed: int, out: Path,
               marker: dict, progress: Callable[[int, int], None] | None = None) -> Path:
    from tqdm.auto import tqdm

    model, tokenizer = load_policy(base)
    input_ids, labels, attention = _sft_tensors(tokenizer, prompts)
    torch.manual_seed(seed)
    order = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    perm, cursor, start = torch.randperm(len(prompts), generator=order), 0, time.perf_counter()
    bar = tqdm(range(steps), desc=f"sft {base.name}", unit="step")
    for done in bar:
        if progress is not None and done:
            progress(done, steps)
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
    if progress is not None:
        progress(steps, steps)
    model.eval()
    seconds = time.perf_counter() - start

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)
        (tmp / "sft.json").write_text(json.dumps({
            "base": str(base), "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
            "prompts": len(prompts), "final_loss": float(loss.item()), "seconds": round(seconds, 2),
        }, indent=2) + "\n")

    return atomic_build(out, write, marker)


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
