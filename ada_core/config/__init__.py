"""Typed configs, algorithm presets and scale profiles: the schema every entry point validates against.

`build_config` layers defaults < scale profile < preset < config file < `--set` overrides (schema.py).
"""

from ada_core.config.schema import (
    SamplerConfig,
    AdvantageConfig,
    LossConfig,
    OptimConfig,
    VLLMConfig,
    RolloutConfig,
    DataConfig,
    LedgerConfig,
    CheckpointConfig,
    DistributedConfig,
    TrainConfig,
    PRESETS,
    PROFILES,
    deep_merge,
    parse_set,
    build_config,
    ConfigError,
    validate_config,
    format_validation_error,
    flat_params,
)

__all__ = [
    "AdvantageConfig", "CheckpointConfig", "ConfigError", "DataConfig", "DistributedConfig", "LedgerConfig",
    "LossConfig", "OptimConfig", "PRESETS", "PROFILES", "RolloutConfig", "SamplerConfig", "TrainConfig",
    "VLLMConfig", "build_config", "deep_merge", "flat_params", "format_validation_error", "parse_set",
    "validate_config"
]
