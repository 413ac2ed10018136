"""A micro-batch of the update: its layout, and the rows it reads once.

Sequence layout in a micro-batch (left-padded prompts, right-padded responses), e.g. prompts of
3 and 2 tokens with responses of 2 and 3 tokens:

    [p p p r r .]      columns 0..P-1 hold the prompt, P..P+T-1 the response (P=3, T=3)
    [. p p r r r]      logits at column P-1+t predict response token t

so the response logits are the last T+1 positions minus the final one (`logits_to_keep=T+1`), and
the LM head never runs over prompt positions.

With `optim.share_prompts` a micro-batch is read with less work than a row at a time (DeepSpeedUpdateEngine.
_response_logits): `collate` numbers its distinct prompts (`prompt_firsts`, `prompt_index`) so each is read
once, and `distinct_sequences` cuts the sub-batch of its distinct sequences (a group's samples that gave the
same answer are one sequence), whose logits go back to every row.
"""

from __future__ import annotations

import torch


def collate(seqs: list[dict], pad_token_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Pack sequences into left-padded prompts + right-padded responses (the module docstring's layout).

    Each seq has `prompt`, `completion` (lists of ids), `behaviour` [n], `advantage`, `truncated`, and
    optionally `old` / `ref` [n]. Returns input_ids / attention_mask / position_ids [B, P+T],
    response_ids / mask / old / ref / behaviour [B, T] (`ref` is None when absent), advantages [B],
    truncated [B] bool, keep [B] (0.0 for a rank's zero-weight padding sequence, `"keep": False`), and
    prompt_firsts [U] / prompt_index [B]: the first row of each of the U distinct prompts, and each row's place
    among them (`_response_logits` reads a prompt once for its rows).
    """
    batch = len(seqs)
    width_p = max(len(s["prompt"]) for s in seqs)
    width_t = max(len(s["completion"]) for s in seqs)
    input_ids = torch.full((batch, width_p + width_t), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width_p + width_t), dtype=torch.long)
    response_mask = torch.zeros((batch, width_t))
    per_token = {key: torch.zeros((batch, width_t)) for key in ("behaviour", "old", "ref")}
    for r, s in enumerate(seqs):
        p, c = len(s["prompt"]), len(s["completion"])
        input_ids[r, width_p - p : width_p] = torch.tensor(s["prompt"], dtype=torch.long)
        input_ids[r, width_p : width_p + c] = torch.tensor(s["completion"], dtype=torch.long)
        attention[r, width_p - p : width_p + c] = 1
        response_mask[r, :c] = 1.0
        for key in per_token:
            if s.get(key) is not None:
                per_token[key][r, :c] = s[key]
    has_ref = all(s.get("ref") is not None for s in seqs)
    owner: dict[tuple[int, ...], int] = {}
    rows = [owner.setdefault(tuple(s["prompt"]), r) for r, s in enumerate(seqs)]
    firsts = torch.tensor(sorted(owner.values()), dtype=torch.long)
    out = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_ids": input_ids[:, width_p:],
        "mask": response_mask,
        "behaviour": per_token["behaviour"],
        "old": per_token["old"],
        "ref": per_token["ref"] if has_ref else None,
        "advantages": torch.tensor([float(s["advantage"]) for s in seqs]),
        "truncated": torch.tensor([bool(s["truncated"]) for s in seqs]),
        "keep": torch.tensor([1.0 if s.get("keep", True) else 0.0 for s in seqs]),
        "prompt_firsts": firsts,  # the first row of each distinct prompt
        "prompt_index": torch.searchsorted(firsts, torch.tensor(rows, dtype=torch.long)),  # row -> its prompt's
    }
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def distinct_sequences(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
    """(the sub-batch of the micro-batch's distinct sequences, in the rows' order, with its own prompt numbering;
    each row's place in it), or None where no sequence repeats. The sub-batch holds what a read needs
    (input_ids, attention_mask, position_ids, response_ids, prompt_firsts, prompt_index)."""
    rows = torch.cat([batch["input_ids"], batch["attention_mask"]], dim=1)
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if int(inverse.max()) + 1 == len(inverse):
        return None
    count, device = len(inverse), inverse.device
    first = torch.full((int(inverse.max()) + 1,), count, device=device).scatter_reduce(
        0, inverse, torch.arange(count, device=device), reduce="amin")  # each sequence's first row
    distinct = first.sort().values  # the sub-batch, in the rows' order
    place = torch.searchsorted(distinct, first[inverse])  # each row's sequence in the sub-batch
    # every prompt's first row is the first of its sequence, so the prompts keep their numbers
    prompts = batch["prompt_index"][distinct]
    firsts = torch.full((int(prompts.max()) + 1,), len(distinct), device=device).scatter_reduce(
        0, prompts, torch.arange(len(distinct), device=device), reduce="amin")
    sub = {key: batch[key][distinct] for key in ("input_ids", "attention_mask", "position_ids", "response_ids")}
    return {**sub, "prompt_firsts": firsts, "prompt_index": prompts}, place
