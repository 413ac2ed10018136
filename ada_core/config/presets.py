"""Algorithm presets, scale profiles, and how a config is built from them.

Algorithm presets (`grpo`, `grpo-n8`, `grpo-n16`, `dapo`, `ada-pos`, `ada-balance`, `ada-est`, ..., and those a
registered sampler brings: `register_sampler(presets=...)`, docs/SAMPLERS.md) say *what* algorithm runs;
scale profiles (`tiny`, `testbed`, `smollm2-135m`, `paper`) say *how big*: prompts per step, lengths and learning
rate suit a model size, and the paper's values do not suit a tiny model. `build_config` layers
defaults < scale profile < preset < config file < `--set` overrides, then validates (schema.py).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from ada_core.config.applies import unread_set_fields
from ada_core.config.schema import ConfigError, TrainConfig, flatten_dotted, validate_config

# The fields that make an algorithm: the only ones a preset may set, so two presets on one profile differ
# in these and nothing else (tests/fast/test_config.py walks every pair). Everything else (optimiser,
# loss clipping, lengths, data) is a shared default, so a comparison of presets compares algorithms.
# The report marks a difference between compared runs outside this list as `other` (report/configs.py).
ALGORITHM_FIELDS = (
    "preset",
    "sampler.name",
    "sampler.n",
    "sampler.exit_rule",
    "sampler.max_gen_batches",
    "sampler.allocation",
    "sampler.options",  # a registered sampler's own fields (ada_core/config/registry.py), each under it
    "advantage.name",
)


def is_algorithm_field(dotted: str) -> bool:
    """Whether a dotted config field is one of ALGORITHM_FIELDS or inside one (`sampler.options.k`)."""
    return dotted in ALGORITHM_FIELDS or any(dotted.startswith(f"{field}.") for field in ALGORITHM_FIELDS)

# Each preset sets only what defines the algorithm; the comment on each value gives its source. Weight
# decay is the shared default, 0 (ref Ada): verl's GRPO script uses 0.01, but giving it to the GRPO and
# DAPO presets alone made every GRPO-vs-Ada comparison a weight-decay comparison too (docs/ALGORITHM.md).
PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {
        "sampler": {"name": "fixed", "n": 4},  # paper's GRPO baseline, n=4
        "advantage": {"name": "grpo"},  # ref GRPO script: group mean/std
    },
    # The paper's larger-group GRPO rows (v3's accuracy table: n = 8 and n = 16); only n differs from grpo.
    "grpo-n8": {
        "sampler": {"name": "fixed", "n": 8},
        "advantage": {"name": "grpo"},
    },
    "grpo-n16": {
        "sampler": {"name": "fixed", "n": 16},
        "advantage": {"name": "grpo"},
    },
    "dapo": {
        "sampler": {"name": "dynamic_filter", "n": 4, "max_gen_batches": 3},  # DAPO; cap is ours
        "advantage": {"name": "grpo"},
    },
    # M and N are left to SamplerConfig's defaults (ref: M=8, N=4) so a scale profile can set them:
    # presets layer over profiles, and the `tiny` profile's M=4 would otherwise never apply.
    "ada-pos": {
        "sampler": {"name": "ada", "exit_rule": "pos", "n": 4},  # paper + ref
        "advantage": {"name": "global_mean"},  # ref: global statistics on, no std
    },
    "ada-balance": {
        "sampler": {"name": "ada", "exit_rule": "balance", "n": 4},  # ref default variant
        "advantage": {"name": "global_mean"},
    },
    # The paper's Reinforce-Ada-Est (v3 sections 3-4, Algorithm 1): about 8 samples a prompt ("most directly
    # comparable to GRPO-n8"), N_x ~ 1/sqrt(p_hat_x) from an EMA of the prompt's history, every sample trained,
    # advantages weighted by 1/sqrt(r_bar_x + eps). n = 8 sets the budget B x 8; est_* defaults (docs/ALGORITHM.md).
    "ada-est": {
        "sampler": {"name": "est", "n": 8},
        "advantage": {"name": "global_mean"},  # pool-mean baseline, as Ada
    },
    # Fixed budget = GRPO's B x n samples a step (ours; docs/ALGORITHM.md gives each idea's source).
    "ada-posterior": {
        "sampler": {"name": "budgeted", "allocation": "posterior", "n": 4},  # Knapsack RL / VIP / MoPPS
        "advantage": {"name": "global_mean"},  # pool-mean baseline, as Ada
    },
    "ada-budget": {
        "sampler": {"name": "budgeted", "allocation": "elimination", "n": 4},  # Ada rounds + GRESO skip
        "advantage": {"name": "global_mean"},
    },
}

PROFILES: dict[str, dict[str, Any]] = {
    # The paper's setting (ref script): Qwen2.5-Math-1.5B on OpenR1-Math-220k, 512 prompts, 2048 tokens,
    # lr 1e-6; evaluated as Table 1 (avg@32, 4096 tokens, the `paper` suite) every 50 steps
    # (ref scripts/eval_model.sh scores global_step 50, 100, ..., 400).
    "paper": {
        "model": "Qwen/Qwen2.5-Math-1.5B",
        "prompts_per_step": 512,
        "steps": 400,
        "eval_k": 32,
        "eval_max_tokens": 4096,
        "eval_suite": "paper",
        "eval_every": 50,
        "optim": {"lr": 1e-6, "warmup_steps": 10, "mini_batches": 4},
        "rollout": {"max_tokens": 2048},
        "data": {"dataset": "open-r1/OpenR1-Math-220k"},
    },
    # SmolLM2-135M on CPU: short answers, few prompts. Ours.
    "smollm2-135m": {
        "model": "smollm2-135m",
        "prompts_per_step": 8,
        "steps": 20,
        "eval_every": 5,
        "eval_k": 4,
        "checkpoint_every": 10,
        "optim": {"lr": 1e-6, "warmup_steps": 2, "mini_batches": 1, "micro_batch_size": 8},
        "rollout": {"max_tokens": 64, "micro_batch_size": 32},
        "data": {"train_size": 512, "eval_size": 32, "curation_k": 8},
        "sampler": {"M": 4},
    },
    # The calibrated testbed (docs/benchmarks/testbed.md): the paper's start regime at CPU scale. A 4-layer tiny
    # Llama warm-started on a stream of fresh sums whose carries slip 3 times in 4, so it adds well but carries
    # badly; curated to the paper's band (1-5 correct of 16); fresh prompts every step (18,720 > 100 x 32 x 2);
    # 1,024 held out and 256 for validation, shared by every seed of a comparison. Ours.
    "testbed": {
        "model": "tiny-l4",
        "prompts_per_step": 32,
        "steps": 100,
        "eval_every": 20,
        "eval_k": 8,
        "checkpoint_every": 50,
        "sft_steps": 2000,
        "sft": {"lr": 1e-3, "batch_size": 128, "prompts": 256000, "carry_slip": 0.75},
        "optim": {"lr": 2e-5, "warmup_steps": 2, "mini_batches": 1, "micro_batch_size": 128},
        # 1,024 rows a generate call: with shared prefixes a decoding step computes about a quarter of them, so
        # fewer, larger calls (the same samples as 256; docs/benchmarks/testbed.md, "Where a grid's time goes").
        "rollout": {"max_tokens": 8, "micro_batch_size": 1024},
        "data": {"dataset": "arithmetic", "train_size": 18720, "eval_size": 1024, "val_size": 256, "seed": 0,
                 "curation_k": 16, "keep_pass_rate": [0.0625, 0.3125]},
    },
    # The tiny Llama on `a+b=` arithmetic: DESIGN.md's CPU calibration point. Ours.
    "tiny": {
        "model": "tiny",
        "prompts_per_step": 32,
        "steps": 60,
        "eval_every": 10,
        "eval_k": 4,
        "checkpoint_every": 20,
        "sft_steps": 600,  # 48% pass on the train pool, 26% held out, ~75 s (docs/benchmarks/models.md)
        "optim": {"lr": 3e-4, "warmup_steps": 2, "mini_batches": 1, "micro_batch_size": 128},
        "rollout": {"max_tokens": 8, "micro_batch_size": 256},
        "data": {"dataset": "arithmetic", "train_size": 2048, "eval_size": 128, "curation_k": 8,
                 "pass_rate_ceiling": 0.875},
        "sampler": {"M": 4},
    },
}


def preset_names() -> list[str]:
    """Every preset: the platform's, then those registered samplers bring (`register_sampler(presets=...)`,
    ada_core/config/registry.py), added to PRESETS as the plugins load. A plugin's preset named like another
    sampler's is a `PluginError`."""
    from ada_core.config.registry import PluginError, specs

    for spec in specs():  # loads the plugins
        for name, preset in spec.presets.items():
            owner = PRESETS.get(name, preset)["sampler"]["name"]
            if owner != spec.name:
                raise PluginError(f"register_sampler({spec.name!r}) preset {name!r}: a preset of that name exists "
                                  f"(sampler {owner!r}); choose another name")
            PRESETS[name] = preset
    return list(PRESETS)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_SCIENTIFIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """Turn `["sampler.M=8", "loss.dual_clip_c=null"]` into a nested dict (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value, e.g. sampler.M=8")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ValueError(f"--set {item!r}: empty key segment")
        node = out
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {'.'.join(parts[: depth + 1])} was already set to a value")
        if isinstance(node.get(parts[-1]), dict):
            raise ValueError(f"--set {item!r}: {key.strip()} already has nested settings")
        value = yaml.safe_load(raw)
        if isinstance(value, str) and _SCIENTIFIC.match(value):
            value = float(value)  # YAML 1.1 reads `3e-4` (no dot) as a string
        node[parts[-1]] = value
    return out


def read_config_file(config_file: str | Path) -> dict[str, Any]:
    """A YAML file of config overrides as a mapping; `ConfigError` naming the file (and line) otherwise."""
    path = Path(config_file)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"config file {path}:{where}: not valid YAML ({problem})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path}: byte {err.start}: not valid UTF-8") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    return loaded


def yaml_lines(config_file: str | Path, loaded: dict[str, Any]) -> dict[str, int | None]:
    """Dotted field -> the 1-based line of its key in `config_file` (None where it cannot be told), for
    every leaf `loaded` (the file, read) sets."""
    lines: dict[str, int | None] = dict.fromkeys(flatten_dotted(loaded))
    try:
        root = yaml.compose(Path(config_file).read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return lines

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            dotted = f"{prefix}{key.value}"
            if dotted in lines:
                lines[dotted] = key.start_mark.line + 1
            walk(value, f"{dotted}.")

    walk(root, "")
    return lines


def build_config(
    preset: str = "grpo",
    profile: str = "tiny",
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    refuse_unread: bool = True,
    facts: dict[str, Any] | None = None,
) -> TrainConfig:
    """Layer defaults < profile < preset < config file < overrides, then validate.

    A bad value raises `ConfigError` naming the dotted field, e.g. `sampler.n: ...`; so does a field the
    config file or an override sets where the run never reads it (ada_core/config/applies.py), e.g.
    `sampler.window` under `schedule: rounds`. Profiles and presets may set such fields (the `tiny`
    profile's `sampler.M` under GRPO): MLflow logs them as `n/a`. `refuse_unread=False` is for a group's
    shared overrides, which need only apply to some of its variants (flows/params.py). `facts`: what the run
    is besides its config (`run_facts`: does it curate, on which device); a set field whose applicability
    needs a fact not given is refused, never taken as read.
    """
    given: dict[str, Any] = {}
    if preset not in preset_names():
        raise ConfigError(f"preset: unknown {preset!r}; choose from {sorted(PRESETS)} (a sampler of your own brings its "
                          "presets once its module is named in $ADA_SAMPLERS or an entry point; docs/SAMPLERS.md)")
    if profile not in PROFILES:
        raise ConfigError(f"profile: unknown {profile!r}; choose from {sorted(PROFILES)}")
    merged = deep_merge(PROFILES[profile], PRESETS[preset])
    merged = deep_merge(merged, {"preset": preset, "profile": profile})
    from_file: dict[str, int | None] = {}  # dotted field the config file sets (and --set does not) -> its line
    if config_file is not None:
        loaded = read_config_file(config_file)
        merged = deep_merge(merged, loaded)
        given = deep_merge(given, loaded)
        from_file = yaml_lines(config_file, loaded)
    if overrides:
        merged = deep_merge(merged, overrides)
        given = deep_merge(given, overrides)
        for key in flatten_dotted(overrides):
            for field in [f for f in from_file if f == key or f.startswith(f"{key}.") or key.startswith(f"{f}.")]:
                del from_file[field]

    def origin(dotted: str) -> str | None:
        """`config file <path>, line <n>` for a field (or a section holding one) the config file set."""
        lines = [line for field, line in from_file.items() if field == dotted or field.startswith(f"{dotted}.")]
        if not lines:
            return None
        known = [line for line in lines if line is not None]
        return f"config file {config_file}" + (f", line {min(known)}" if known else "")

    config = validate_config(merged, origin)
    unread = unread_set_fields(config, given, facts) if refuse_unread else []
    if unread:
        raise ConfigError("; ".join(f"{where}: {line}" if (where := origin(line.split(":", 1)[0])) else line
                                    for line in unread))
    return config
