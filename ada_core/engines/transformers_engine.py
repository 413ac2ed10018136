"""The embedded CPU rollout engine: batched sampling from an in-process HF causal LM with a KV cache.

One `generate` call serves a whole sampler round: every `(prompt, k)` request is expanded to k rows,
rows are split into micro-batches, each micro-batch is left-padded and decoded token by token.
The engine shares its model object with the update engine, so new weights need no sync.

Conventions (the update engine relies on them):
- `completion_ids` keep the EOS token, so the policy is trained to stop; `text` excludes it.
- `logprobs[t]` is log softmax(logits_t / T)[token_t]: the temperature-scaled distribution WITHOUT
  top-p renormalisation, exactly what the update engine recomputes for the old policy, so the PPO
  ratio starts at 1 (at T=1 and top_p=1 it is the exact sampling probability).
- `truncated` is True when `max_tokens` ran out before EOS or a stop string.
- A stop string ends the completion: `text` is cut before it, `completion_ids` end with the token
  that completed it (the policy learns to emit it).

Seeding: row (request i, copy j) draws its uniforms from its own generator seeded by
hash(sampling.seed, i, j), and tokens are drawn by inverse-CDF sampling. So the same seed gives the
same samples whatever the micro-batch size, and copy j of a request does not depend on k.
A seed of None draws a fresh random base seed per call.

Shared prefixes: a micro-batch computes each step once per distinct prefix (the prompt and the tokens drawn
so far), not once per row. Copies of a prompt read it once, and while two copies have drawn the same tokens
they are the same computation, so they share its logits and KV cache and part where their draws differ
(each row still draws from its own uniforms); a finished row leaves the batch. The samples are the same as
one computation per row, bit for bit on the CPUs measured; at the testbed's k = 8 and 2-4 token answers a
step decodes about a quarter of the rows (docs/benchmarks/testbed.md). `share_prefixes=False` computes
every row, as before.

Why our own loop rather than `model.generate`: on CPU with a ~400K-parameter model the per-token
Python overhead dominates, and `generate` adds logits processors, stopping criteria and score
copies on every token (measured in docs/benchmarks/engines.md).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Sequence

import torch

from ada_core.engines.requests import check_requests, row_seed
from ada_core.protocols import RolloutEngine, SamplingParams
from ada_core.records import Prompt, Sample


class TransformersRolloutEngine(RolloutEngine):
    """`RolloutEngine` over an HF causal LM (any `AutoModelForCausalLM` with a KV cache)."""

    def __init__(self, model, tokenizer, micro_batch_size: int = 64, share_prefixes: bool = True):
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        self.share_prefixes = share_prefixes  # one forward per distinct prefix of a micro-batch, else per row
        self.eos_ids = _eos_ids(model, tokenizer)
        if not self.eos_ids:
            raise ValueError("the tokenizer and model config define no eos token; generation could never stop")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.pad_id = int(pad)
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; `logits_to_keep=1` skips the LM head
        # over the prompt positions at prefill, where the models that support it.
        self._step_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def generate(self, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams,
                 request_offset: int = 0) -> list[list[Sample]]:
        """Return, for each `(prompt, k)` request, exactly k unscored Samples, in request order.

        `request_offset`: the index of `requests[0]` in a larger call split across ranks, so each row's
        seed is the one it would get in the whole call."""
        check_requests(requests, sampling)
        rows = [(i, j) for i, (_, k) in enumerate(requests) for j in range(k)]  # (request index, copy index)
        base_seed = sampling.seed if sampling.seed is not None else random.SystemRandom().getrandbits(63)
        out: list[list[Sample]] = [[] for _ in requests]
        was_training = self.model.training
        self.model.eval()
        try:
            # no_grad, not inference_mode: the model is shared with the update engine, and any tensor
            # a module caches under inference_mode could not be saved for backward later.
            with torch.no_grad():
                for start in range(0, len(rows), self.micro_batch_size):
                    chunk = rows[start : start + self.micro_batch_size]
                    prompts = [requests[i][0] for i, _ in chunk]
                    seeds = [row_seed(base_seed, request_offset + i, j) for i, j in chunk]
                    for (i, _), sample in zip(chunk, self._generate_batch(prompts, seeds, sampling)):
                        out[i].append(sample)
        finally:
            self.model.train(was_training)
        return out

    def _generate_batch(self, prompts: list[Prompt], seeds: list[int], sampling: SamplingParams) -> list[Sample]:
        """Sample one completion per row of a left-padded micro-batch."""
        device = next(self.model.parameters()).device
        batch, width, steps = len(prompts), max(len(p.prompt_ids) for p in prompts), sampling.max_tokens
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for r, p in enumerate(prompts):
            input_ids[r, width - len(p.prompt_ids) :] = torch.tensor(p.prompt_ids, dtype=torch.long)
            attention[r, width - len(p.prompt_ids) :] = 1
        # One uniform per (row, step), from the row's own generator: independent of batch layout.
        uniforms = torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                                for s in seeds]).to(device)
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        eos = torch.tensor(self.eos_ids, device=device)

        tokens = torch.full((batch, steps), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, steps), dtype=torch.float32, device=device)
        lengths = torch.full((batch,), steps, dtype=torch.long, device=device)  # tokens kept per row
        ended = torch.zeros(batch, dtype=torch.bool, device=device)  # EOS or a stop string seen
        stop_cut: dict[int, int] = {}  # row -> char offset of the stop string in its text
        cache = _new_cache(self.model)
        # The nodes are the distinct prefixes of the rows still decoding: the cache holds one row per node and
        # `node[r]` is row r's. At the start a node is a distinct prompt (every row, unshared).
        if self.share_prefixes:
            owner: dict[tuple[int, ...], int] = {}
            rows = [owner.setdefault(tuple(p.prompt_ids), r) for r, p in enumerate(prompts)]
            firsts = torch.tensor(sorted(owner.values()), device=device)
            node = torch.searchsorted(firsts, torch.tensor(rows, device=device))
        else:
            firsts = node = torch.arange(batch, device=device)
        node_input, node_attention, node_pos = input_ids[firsts], attention[firsts], positions[firsts]
        for t in range(steps):
            logits = self._logits(node_input, node_attention, node_pos, cache)
            vocab = logits.shape[-1]
            live = (~ended).nonzero().flatten()
            token, logprob = sample_tokens(logits[node[live]], uniforms[live, t], sampling.temperature, sampling.top_p)
            tokens[live, t], logprobs[live, t] = token, logprob
            hit_eos = torch.isin(token, eos)
            lengths[live[hit_eos]] = t + 1
            ended[live[hit_eos]] = True
            if sampling.stop:
                for r in live[~hit_eos].tolist():
                    cut = _find_stop(self.tokenizer.decode(tokens[r, : t + 1].tolist(), skip_special_tokens=True),
                                     sampling.stop)
                    if cut is not None:
                        stop_cut[r], lengths[r], ended[r] = cut, t + 1, True
            go_on = ~ended[live]
            if not bool(go_on.any()) or t + 1 == steps:
                break
            # The next nodes: a row going on extends its node by its token; rows that drew the same token from
            # one node stay one node (unshared, every row is its own).
            rows_on, drawn = live[go_on], token[go_on]
            key = node[rows_on] * vocab + drawn if self.share_prefixes else rows_on * vocab + drawn
            keys, inverse = torch.unique(key, return_inverse=True)
            parent = keys // vocab if self.share_prefixes else node[keys // vocab]
            cache.reorder_cache(parent)
            node = torch.zeros(batch, dtype=torch.long, device=device)
            node[rows_on] = inverse
            node_input = (keys % vocab).unsqueeze(-1)
            node_attention = torch.cat([node_attention[parent], torch.ones((len(keys), 1), dtype=attention.dtype,
                                                                           device=device)], dim=1)
            node_pos = node_pos[parent][:, -1:] + 1

        samples = []
        for r, prompt in enumerate(prompts):
            n = int(lengths[r])
            ids = tokens[r, :n].tolist()
            body = ids[:-1] if ids and ids[-1] in self.eos_ids and r not in stop_cut else ids
            text = self.tokenizer.decode(body, skip_special_tokens=True)
            if r in stop_cut:
                text = text[: stop_cut[r]]
            samples.append(Sample(prompt_id=prompt.id, completion_ids=ids, logprobs=logprobs[r, :n].tolist(),
                                  text=text, truncated=not bool(ended[r])))
        return samples


    def _logits(self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """The next token's logits [B, V] of one decoding step (the prompt's at the first), extending `cache`."""
        return self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                          **self._step_kwargs, **{self._cache_kwarg: cache}).logits[:, -1, :]


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_p: float):
    """Inverse-CDF sampling at temperature T with nucleus top_p.

    logits [B, V], uniforms [B] in [0, 1) -> (tokens [B], behaviour log-probs [B]). The log-prob is
    log softmax(logits / T) of the drawn token, without top-p renormalisation (see module docstring).

    Example: probs [0.5, 0.3, 0.2], top_p 0.6 keeps tokens 0 and 1 (the smallest set reaching 0.6),
    renormalised to [0.625, 0.375, 0]; u = 0.7 draws token 1 with log-prob log(0.3).
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logp.double().exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly ahead of each token
        sorted_probs = torch.where(before < top_p, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    cdf = probs.cumsum(-1)
    # right=True picks the first index whose cdf exceeds u * total, so a zero-probability token is
    # never drawn; the clamp guards float rounding at the very top.
    tokens = torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    tokens = tokens.clamp(max=logits.shape[-1] - 1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Char offset of the earliest stop string in `text`, or None."""
    found = [text.find(s) for s in stops if s and s in text]
    return min(found) if found else None


def _eos_ids(model, tokenizer) -> list[int]:
    ids: list[int] = []
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, config_eos):
        if value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if int(v) not in ids:
                ids.append(int(v))
    return ids


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()
