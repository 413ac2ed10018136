"""Prompt sets: generators, dataset files, the train/eval split and the training prompt stream.

- `generators`: seeded `arithmetic` and reasoning-gym prompts.
- `files`: local parquet/jsonl in the paper's HF schemas.
- `prompts`: `load_prompts` (a generator or a file), the split, digests, the SFT draw.
- `source`: `PromptSource`, the seeded, resumable prompt stream a run trains on.
- `hf`: Hugging Face `datasets` for local files, cached under ADA_HOME (imported by name: it loads `datasets`).
- `hub`: hub ids `org/name[@revision]` for models and datasets, resolved through the hub cache (checked whole) and pinned
  to their commit (imported by name).
- `suites`: named evaluation suites (`paper`: the paper's Table 1 benchmarks by hub id), the weighted
  average and the accuracy table (imported by name).
- `curation`: dedup, verifiable answers, difficulty filtering (imported by name).
"""

from ada_core.data.prompts import (
    data_digest,
    prompts_digest,
    load_prompts,
    RunSplit,
    run_split,
    split_prompts,
    SFT_SEED_OFFSET,
    SFT_DRAW_SIZE,
    warm_start_prompts,
)
from ada_core.data.generators import (
    arithmetic_prompts,
    REASONING_GYM_TASKS,
    reasoning_gym_prompts,
    reasoning_gym_levels,
    GENERATORS,
    generate_prompts,
    slip_carries,
    slipped_sum,
)
from ada_core.data.files import FileSchema, SCHEMAS, detect_schema, load_dataset_file, RECORD_COLUMNS
from ada_core.data.source import PromptSource

__all__ = [
    "FileSchema", "GENERATORS", "PromptSource", "RunSplit", "REASONING_GYM_TASKS", "RECORD_COLUMNS", "SCHEMAS", "SFT_DRAW_SIZE",
    "SFT_SEED_OFFSET", "arithmetic_prompts", "data_digest", "detect_schema", "generate_prompts",
    "load_dataset_file", "load_prompts", "prompts_digest", "reasoning_gym_levels", "reasoning_gym_prompts", "run_split",
    "slip_carries", "slipped_sum", "split_prompts", "warm_start_prompts"
]
