"""The parameter form's vocabulary and its checks, shared by every flow's parameters.

The field types a form offers (preset, profile, engine, a concurrency limit's name), the base model that
refuses an unknown field, and the free-form `overrides`: nesting its dotted keys, checking each against
TrainConfig (`check_overrides`), the JSON schema that lets the Prefect server refuse an unknown key
(`overrides_schema`), and Prefect's JSON wrapper as the form's JSON view sends it (`FormJson`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from pydantic_core import PydanticUseDefault, core_schema

from ada_core.config import PROFILES, ConfigError, TrainConfig, flatten_dotted



def check_preset(name: str) -> str:
    """A preset of the platform or of a registered sampler (ada_core/config/registry.py), else a ValueError
    listing them."""
    from ada_core.config.presets import preset_names

    choices = preset_names()
    if name not in choices:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(choices)}")
    return name


class _PresetChoices:
    """A preset name, checked against the presets when a value is validated and listed as the JSON schema's
    `enum` when a schema is made (a form shows them as choices): both read the registry then, so a sampler
    registered by a plugin is a choice of every form served after it loads, with no change here."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_after_validator_function(check_preset, core_schema.str_schema())

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        from ada_core.config.presets import preset_names

        return {"type": "string", "enum": preset_names()}


Preset = Annotated[str, _PresetChoices]
Profile = Literal["tiny", "testbed", "smollm2-135m", "paper"]
Engine = Literal["transformers", "vllm"]
# Prefect refuses these characters in a concurrency limit's name.
LimitName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[^/%&><]+$")]


def nest_dotted(flat: dict[str, Any]) -> dict[str, Any]:
    """`{"sampler.M": 8, "optim": {"lr": 1e-4}}` -> `{"sampler": {"M": 8}, "optim": {"lr": 1e-4}}`."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError(f"overrides: empty segment in key {key!r}")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"overrides: {key!r} sets a field inside {part!r}, which is also set to a value")
            node = child
        leaf = parts[-1]
        if isinstance(value, dict):
            value = nest_dotted(value)
            if isinstance(node.get(leaf), dict):
                value = {**node[leaf], **value}
        node[leaf] = value
    return out


def check_engine(config: TrainConfig) -> TrainConfig:
    """vLLM needs its own environment (`make vllm-env`) or a server to attach to; sleep mode needs CUDA."""
    from ada_core.engines.vllm_server import check_engine_config

    check_engine_config(config)
    return config


def config_field(key: str):
    """The pydantic field of TrainConfig at dotted `key`, or a ValueError saying why there is none."""
    model: type[BaseModel] = TrainConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        where = ".".join(parts[:depth]) or "the config"
        if field is None:
            known = ", ".join(sorted(model.model_fields))
            near = difflib.get_close_matches(part, list(model.model_fields), n=1)
            hint = f"did you mean {'.'.join([*parts[:depth], near[0]])!r}? " if near else ""
            raise ValueError(f"overrides: unknown key {key!r}: {where} has no field {part!r} ({hint}its fields: {known}; "
                             "every key: docs/CONFIG.md)")
        if depth == len(parts) - 1:
            return field
        annotation = field.annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise ValueError(  # noqa: TRY004 - pydantic reports a ValueError as the field's error
                f"overrides: unknown key {key!r}: {'.'.join(parts[: depth + 1])} is a value, not a section")
        model = annotation
    raise ValueError(f"overrides: empty key {key!r}")


def check_overrides(overrides: dict[str, Any], own: dict[str, str]) -> None:
    """Refuse an override that is no config field, has the wrong type, or is set by a flow field (`own`:
    dotted key -> that field's name), naming the key."""
    for key, value in flatten_dotted(nest_dotted(overrides)).items():
        if key in own:
            raise ValueError(f"overrides: {key!r} is set by this flow's own `{own[key]}` field (the run's name, tags "
                             f"and report use that one); give it there, not in overrides")
        problems = []
        for field in option_fields(key) if key.startswith(OPTIONS_PREFIX) else [config_field(key)]:
            annotation = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            try:
                TypeAdapter(annotation).validate_python(value)
                break
            except ValidationError as err:
                problems.append("; ".join(e["msg"] for e in err.errors()))
        else:
            raise ValueError(f"overrides: {key!r}: {problems[0]} (got {value!r})") from None


OPTIONS_PREFIX = "sampler.options."


def option_fields(key: str) -> list[Any]:
    """The pydantic fields named by `sampler.options.<field>` in the registered samplers' options models (one per
    sampler that has such an option: which applies depends on the preset, and building the config checks it),
    or a ValueError naming the key and every option there is."""
    from ada_core.config.registry import specs

    option = key.removeprefix(OPTIONS_PREFIX)
    models = [spec.options for spec in specs() if spec.options is not None]
    found = [model.model_fields[option] for model in models if option in model.model_fields]
    if not found:
        known = sorted({f"{OPTIONS_PREFIX}{name}" for model in models for name in model.model_fields})
        raise ValueError(f"overrides: unknown key {key!r}: no registered sampler has the option {option!r} (options: "
                         f"{', '.join(known) or 'none'})")
    return found


def override_keys(exclude: dict[str, str] | None = None) -> list[str]:
    """Every dotted key `overrides` may name (each field and each section of TrainConfig, and each registered
    sampler's options), less `exclude`."""
    keys: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            keys.append(prefix + name)
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                walk(field.annotation, f"{prefix}{name}.")

    walk(TrainConfig, "")
    from ada_core.config.registry import specs

    for spec in specs():  # a registered sampler's own options (sampler.options.<field>)
        keys += [f"{OPTIONS_PREFIX}{name}" for name in (spec.options.model_fields if spec.options else ())]
    return sorted(k for k in set(keys) if k not in (exclude or {}))


PREFECT_KIND = "__prefect_kind"


def unwrap_form_json(value: Any) -> Any:
    """A free-form object field (`overrides`, `pools`) as Prefect's run form may send it: the form holds such a
    field as `{"__prefect_kind": "json", "value": "<its JSON text>"}`, which the server unwraps at the top of
    the parameters only; from the form's JSON view the wrapper arrives nested, as it is. Its value, parsed;
    an emptied box (no value) is the field's default."""
    if not (isinstance(value, dict) and value.get(PREFECT_KIND) == "json"):
        return value
    text = value.get("value")
    if text is None:
        raise PydanticUseDefault()
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON: {err}") from None


FormJson = BeforeValidator(unwrap_form_json)
# The wrapper itself, as the server's schema check sees it: the JSON text is checked when the run starts.
FORM_JSON_SCHEMA = {"properties": {PREFECT_KIND: {"const": "json"}, "value": {"type": ["string", "null"]}},
                    "required": [PREFECT_KIND], "additionalProperties": False}


def form_json_schema(own: dict[str, Any] | None = None) -> Callable[[dict[str, Any]], None]:
    """`json_schema_extra` of a free-form object field: its constraints (pydantic's, then `own`) apply to an
    object, or the field is Prefect's JSON wrapper (`unwrap_form_json`): the run form's JSON view submits."""
    def extra(schema: dict[str, Any]) -> None:
        inner = {key: schema.pop(key) for key in ("additionalProperties", "minProperties") if key in schema}
        schema.update({"if": {"required": [PREFECT_KIND]}, "then": FORM_JSON_SCHEMA, "else": {**inner, **(own or {})}})
    return extra


def overrides_schema(exclude: dict[str, str]) -> Callable[[dict[str, Any]], None]:
    """JSON schema of `overrides` beyond `object`: its keys, so the Prefect server refuses a flow run with an
    unknown key when the run is created (deployments enforce their parameter schema), in a message short
    enough to mark the field with: `Additional properties are not allowed ('sampler.MM' was unexpected)` (an
    `enum` or a pattern of the keys makes one that lists all ~120 of them). The keys sit under `else`, where
    the form does not look: it shows one JSON box, not a field per key. The keys are read when the schema is
    made, so a registered sampler's options (`sampler.options.<field>`) are among them."""
    def extra(schema: dict[str, Any]) -> None:
        keys = override_keys(exclude)
        form_json_schema({"properties": {key: {} for key in keys}, "additionalProperties": False})(schema)
    return extra


def by_profile(field: str) -> str:
    """`60 on tiny, 20 on smollm2-135m, 400 on paper`: what each profile sets `field` to, for a form field's
    description (a form's default cannot follow the profile chosen, so the description says them all)."""
    return ", ".join(f"{PROFILES[name][field]} on {name}" for name in get_args(Profile))


class FlowParams(BaseModel):
    """Every flow's parameters: a field the form does not have is refused."""

    model_config = ConfigDict(extra="forbid")


