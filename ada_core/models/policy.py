"""Loading a policy and its tokenizer, and prompt formatting, which depends only on the tokenizer: a
tokenizer with a chat template gets a user turn asking for a `\\boxed{}` answer; the tiny model gets
`<bos>12+345=`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ada_core.models.build import resolve_model
from ada_core.records import Prompt


BOXED_INSTRUCTION = "Put your final answer within \\boxed{}."


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
