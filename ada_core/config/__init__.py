"""Typed configs, algorithm presets and scale profiles: what every entry point validates against.

- `schema`: the pydantic models (`TrainConfig` and its sections), `validate_config`, `flat_params`.
- `presets`: the algorithm presets (and `ALGORITHM_FIELDS`, the only fields they set), the scale
  profiles, and `build_config`, which layers defaults <
  scale profile < preset < config file < `--set` overrides.
- `registry`: every sampler by name (`register_sampler`; plugins from $ADA_SAMPLERS and entry points), which
  `sampler.name` and `sampler.options` are validated against; docs/SAMPLERS.md.
- `applies`: where each field applies (`ALWAYS`, `LABEL`, `when(...)`, declared next to its description):
  MLflow's `n/a`, docs/CONFIG.md (`python -m ada_core.config`) and the refusal of a field set where it is
  never read all read it.
"""

from ada_core.config.presets import (
    ALGORITHM_FIELDS,
    PRESETS,
    PROFILES,
    build_config,
    deep_merge,
    parse_set,
    read_config_file,
)
from ada_core.config.schema import (
    AdvantageConfig,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    DistributedConfig,
    LedgerConfig,
    LossConfig,
    OptimConfig,
    RolloutConfig,
    SamplerConfig,
    TrainConfig,
    VerifierConfig,
    VLLMConfig,
    flat_params,
    flatten_dotted,
    format_validation_error,
    validate_config,
)

__all__ = [
    "ALGORITHM_FIELDS", "AdvantageConfig", "CheckpointConfig", "ConfigError", "DataConfig", "DistributedConfig", "LedgerConfig",
    "LossConfig", "OptimConfig", "PRESETS", "PROFILES", "RolloutConfig", "SamplerConfig", "TrainConfig",
    "VerifierConfig", "VLLMConfig", "build_config", "deep_merge", "flat_params", "flatten_dotted", "format_validation_error", "parse_set",
    "read_config_file", "validate_config"
]
