"""Flow parameters as pydantic models, so Prefect's UI shows a validated, documented form.

Every `overrides` key is checked when the parameters are validated (Prefect does that before the
flow body starts): a key that is no config field, a value of the wrong type, or a key the flow sets
from a field of its own (`seed`, `preset`, ...: the run's name, tags and report use that one) is
refused with the key named. A flow then builds its `TrainConfig` first thing (`build_config`), so
a bad combination fails before any model, dataset or MLflow run exists (`sampler.n: ...`).

This module is their one name to import from; they live by kind:
- flows/param_form.py: the form's field types and the `overrides` machinery every model uses;
- flows/run_params.py: the training-type flows (train, and the groups compare and sweep);
- flows/eval_params.py: the flows that sample a model without training it (evaluate, curate);
- flows/paper_params.py: the paper grid and the `paper-tables` flow.
"""

from __future__ import annotations

from ada_core.config import flatten_dotted
from flows.eval_params import CurateParams, EvaluateParams
from flows.paper_params import (
    PAPER_GRIDS,
    PAPER_HELD_OUT,
    PAPER_METHODS,
    PAPER_OVERRIDES,
    PAPER_OWN_FIELDS,
    PAPER_POOLS,
    PAPER_PROFILE,
    PAPER_RAW_POOL,
    PAPER_SEEDS,
    PaperTablesParams,
)
from flows.param_form import (
    FORM_JSON_SCHEMA,
    PREFECT_KIND,
    Engine,
    FlowParams,
    FormJson,
    LimitName,
    Preset,
    Profile,
    by_profile,
    check_engine,
    check_overrides,
    config_field,
    form_json_schema,
    nest_dotted,
    override_keys,
    overrides_schema,
    unwrap_form_json,
)
from flows.run_params import (
    GROUP_DATA_SEED,
    MATCHED_LABEL,
    RUN_OWN_FIELDS,
    CompareParams,
    GroupSettings,
    RunSettings,
    SweepParams,
    TrainParams,
)

__all__ = [
    "FORM_JSON_SCHEMA", "GROUP_DATA_SEED", "MATCHED_LABEL", "PAPER_GRIDS", "PAPER_HELD_OUT", "PAPER_METHODS",
    "PAPER_OVERRIDES", "PAPER_OWN_FIELDS", "PAPER_POOLS", "PAPER_PROFILE", "PAPER_RAW_POOL", "PAPER_SEEDS",
    "PREFECT_KIND", "RUN_OWN_FIELDS", "CompareParams", "CurateParams", "Engine", "EvaluateParams", "FlowParams",
    "FormJson", "GroupSettings", "LimitName", "PaperTablesParams", "Preset", "Profile", "RunSettings", "SweepParams",
    "TrainParams", "by_profile", "check_engine", "check_overrides", "config_field", "flatten_dotted",
    "form_json_schema", "nest_dotted", "override_keys", "overrides_schema", "unwrap_form_json",
]
