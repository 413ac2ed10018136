"""The sampler registry: every sampler, built-in or a researcher's own, is one class registered by name.

    from ada_core.sampling import SamplerOptions, register_sampler

    class TopKOptions(SamplerOptions):
        k: int = Field(2, ge=1, description="...")

    @register_sampler("topk", options=TopKOptions, presets={"topk": {"advantage": {"name": "global_mean"}}})
    class TopKSampler: ...

`sampler.name: topk` then selects it like `fixed` or `ada`; its options are the config's `sampler.options`,
validated by `TopKOptions` (an unknown or bad option fails naming `sampler.options.<field>`); each preset it
registers is a variant of `ada train --preset`, `ada simulate`, the flows' forms, compare, sweep and the
paper grid (ada_core/config/presets.py `preset_names` adds them to PRESETS). docs/SAMPLERS.md gives the
contract (`ada_core.protocols.Sampler`) and a worked example (examples/second_chance.py).

Where plugins come from, loaded lazily the first time the registry is read (`load_plugins`):
- the entry-point group `ada_platform.samplers` of every installed package (read once per process):
  `name = package.module` (or `package.module:Class`), where the module registers a sampler called `name`;
- `$ADA_SAMPLERS`: comma-separated module names (importable from `sys.path`) or paths to `.py` files.
A plugin that fails to import, or registers nothing under its entry point's name, is a `PluginError`
naming the entry point or the `$ADA_SAMPLERS` item, in one line (the CLI exits 2).

The registry sits in the config layer, under the schema that validates `sampler.name` and `sampler.options`:
it knows the built-in samplers' names from the start (`BUILTIN`), and their classes once
ada_core/sampling/samplers.py registers them, through the same decorator.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ada_core.config.strict import _Strict
from ada_core.errors import ConfigError

ENTRY_POINT_GROUP = "ada_platform.samplers"
PLUGINS_ENV = "ADA_SAMPLERS"
# The built-in samplers, by name: their classes register from here when ada_core.sampling is imported.
BUILTIN = {name: f"ada_core.sampling.samplers:{cls}" for name, cls in (
    ("fixed", "FixedSampler"), ("dynamic_filter", "DynamicFilterSampler"), ("ada", "AdaSampler"),
    ("budgeted", "BudgetedSampler"), ("est", "EstSampler"))}
# The research samplers (issue #37; ada_core/sampling/research.py): registered through the same decorator, with
# options and presets of their own, imported the first time the registry is read (`load_plugins`), so a config,
# a preset list or the paper grid sees them without ada_core.sampling imported first.
RESEARCH_MODULE = "ada_core.sampling.research"
RESEARCH = ("knapsack", "pilot", "greso", "ada_v3w")
# What a registered sampler's preset may set: the algorithm fields (ada_core/config/presets.py ALGORITHM_FIELDS)
# a sampler of one's own reads; the other algorithm fields belong to built-in samplers.
PRESET_FIELDS = ("sampler.n", "sampler.options", "advantage.name")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_PRESET_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class PluginError(ConfigError):
    """A sampler plugin cannot be loaded or registered; the message names it (the CLI exits 2)."""


class SamplerOptions(_Strict):
    """Base of a sampler's own config fields (`sampler.options`): an unknown field is refused, as everywhere
    in the config. Give every field a description: docs and forms show it."""


@dataclass(frozen=True)
class SamplerSpec:
    """One registered sampler: its name (`sampler.name`), class, options model, presets and origin."""

    name: str
    cls: type | None
    """None only for a built-in sampler whose module is not imported yet."""
    options: type[SamplerOptions] | None
    origin: str
    """`module:Class`, for messages."""
    source: str | None = None
    """The file that defined the class: the same class loaded twice (by module and by path) is one sampler."""
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Preset name -> its settings, `sampler.name` included (PRESETS' form)."""

    @property
    def builtin(self) -> bool:
        return self.origin.startswith("ada_core.")


_SAMPLERS: dict[str, SamplerSpec] = {name: SamplerSpec(name, None, None, origin) for name, origin in BUILTIN.items()}
_LOADED: set[str] = set()  # entry points and $ADA_SAMPLERS items already imported
_ENTRY_POINTS: list[importlib.metadata.EntryPoint] | None = None


def register_sampler(name: str, *, options: type[SamplerOptions] | None = None,
                     presets: dict[str, dict[str, Any]] | None = None) -> Callable[[type], type]:
    """Class decorator: register the sampler `name` (`sampler.name`).

    - The class has the methods of `ada_core.protocols.Sampler` and is built as `cls(cfg, advantage)`.
    - `options`: a `SamplerOptions` subclass, the sampler's own fields (`sampler.options.<field>`); None: it
      takes none, and a config that gives any is refused.
    - `presets`: preset name -> what it sets besides `sampler.name` (`{"sampler": {"n": 4, "options": {...}},
      "advantage": {"name": "global_mean"}}`: PRESET_FIELDS only); each becomes a variant everywhere a preset
      is chosen. None: one preset named after the sampler (`_` as `-`), with every default. The built-in
      samplers pass `{}`: their presets are the platform's own table (ada_core/config/presets.py).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise PluginError(f"register_sampler({name!r}): a sampler name is lower-case letters, digits and _, "
                          "starting with a letter (it is a config value: sampler.name)")

    def wrap(cls: type) -> type:
        from ada_core.protocols import Sampler

        origin = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', cls)}"
        if not isinstance(cls, type) or not issubclass(cls, Sampler):
            missing = [m for m in ("sample", "state_dict", "load_state_dict", "close") if m not in dir(cls)]
            raise PluginError(f"register_sampler({name!r}) on {origin}: a sampler is a class with sample, state_dict, "
                              f"load_state_dict, close (ada_core.protocols.Sampler); it lacks {', '.join(missing)}")
        if options is not None:
            _check_options(name, options)
        source = _source(cls)
        known = _SAMPLERS.get(name)
        same = known is not None and (known.origin == origin or (
            source is not None and known.source == source and known.origin.split(":")[1] == cls.__qualname__))
        if known is not None and not same:
            raise PluginError(f"register_sampler({name!r}) on {origin}: the name is taken by {known.origin}; "
                              "choose another name")
        chosen = _presets(name, {name.replace("_", "-"): {}} if presets is None else presets)
        taken = {p: s.name for s in _SAMPLERS.values() if s.name != name for p in s.presets}
        clash = [p for p in chosen if p in taken]
        if clash:
            raise PluginError(f"register_sampler({name!r}) preset {clash[0]!r}: sampler {taken[clash[0]]!r} "
                              "registered a preset of that name; choose another name")
        _SAMPLERS[name] = SamplerSpec(name, cls, options, origin, source, chosen)
        return cls

    return wrap


def _source(cls: type) -> str | None:
    try:
        return str(Path(inspect.getfile(cls)).resolve())
    except (TypeError, OSError):
        return None


def _check_options(name: str, options: Any) -> None:
    if not (isinstance(options, type) and issubclass(options, SamplerOptions)):
        raise PluginError(f"register_sampler({name!r}): options must be a subclass of "
                          f"ada_core.sampling.SamplerOptions (strict: unknown fields refused), got {options!r}")
    undescribed = [f for f, info in options.model_fields.items() if not info.description]
    if undescribed:
        raise PluginError(f"register_sampler({name!r}): option {undescribed[0]!r} of {options.__name__} has no "
                          "description: give Field(..., description=...) (docs and forms show it)")


def _dotted(nested: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in nested.items():
        name = f"{prefix}{key}"
        out += _dotted(value, f"{name}.") if isinstance(value, dict) else [name]  # an empty section sets nothing
    return out


def _presets(name: str, presets: Any) -> dict[str, dict[str, Any]]:
    """`presets` as PRESETS entries (sampler.name set), or PluginError naming the first bad one."""
    if not isinstance(presets, dict):
        raise PluginError(f"register_sampler({name!r}): presets must be a dict of preset name -> settings")
    out: dict[str, dict[str, Any]] = {}
    for preset, settings in presets.items():
        where = f"register_sampler({name!r}) preset {preset!r}"
        if not isinstance(preset, str) or not _PRESET_NAME.match(preset):
            raise PluginError(f"{where}: a preset name is lower-case letters, digits, '-', '_' and '.'")
        if not isinstance(settings, dict):
            raise PluginError(f"{where}: its settings must be a dict such as "
                              "{'sampler': {'n': 4}, 'advantage': {'name': 'grpo'}}")
        sampler = dict(settings.get("sampler") or {})
        if sampler.pop("name", name) != name:
            raise PluginError(f"{where}: sets sampler.name={settings['sampler']['name']!r}; a sampler's presets "
                              "select it")
        entry = {**settings, "sampler": {**sampler, "name": name}, "advantage": dict(settings.get("advantage") or {})}
        outside = [k for k in _dotted({**settings, "sampler": sampler})
                   if not any(k == f or k.startswith(f"{f}.") for f in PRESET_FIELDS)]
        if outside:
            raise PluginError(f"{where}: sets {outside[0]}; a preset sets only {', '.join(PRESET_FIELDS)} (the "
                              "algorithm), so that compared presets differ in their algorithm alone")
        entry["advantage"].setdefault("name", "grpo")
        out[preset] = entry
    return out


def _import_path(path: Path) -> None:
    """Import a `.py` file as a module named after its stem (once: later loads find it in sys.modules)."""
    module_name = f"ada_sampler_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}"
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise


def load_plugins() -> None:
    """Import every `ada_platform.samplers` entry point and every `$ADA_SAMPLERS` item not imported yet;
    `PluginError` naming the first that fails."""
    global _ENTRY_POINTS
    if RESEARCH_MODULE not in _LOADED:
        _LOADED.add(RESEARCH_MODULE)  # first: the module's own registry reads must not import it again
        try:
            importlib.import_module(RESEARCH_MODULE)
        except BaseException:
            _LOADED.discard(RESEARCH_MODULE)
            raise
    if _ENTRY_POINTS is None:  # read once per process: installing a package needs a new process anyway
        _ENTRY_POINTS = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    for ep in _ENTRY_POINTS:
        key = f"ep:{ep.name}={ep.value}"
        if key in _LOADED:
            continue
        shown = f"sampler plugin entry point {ep.name!r} ({ep.value}, group {ENTRY_POINT_GROUP})"
        try:
            ep.load()
        except PluginError as err:
            raise PluginError(f"{shown}: {err}") from None
        except Exception as err:  # noqa: BLE001 - any failure of a plugin's import is reported as its own
            raise PluginError(f"{shown} failed to load: {type(err).__name__}: {err}") from None
        if ep.name not in _SAMPLERS:
            raise PluginError(f"{shown} registered no sampler named {ep.name!r}: decorate its class with "
                              f"@register_sampler({ep.name!r})")
        _LOADED.add(key)
    for item in [part.strip() for part in os.environ.get(PLUGINS_ENV, "").split(",") if part.strip()]:
        path = Path(item).expanduser()
        is_path = item.endswith(".py") or os.sep in item
        key = f"env:{path.resolve() if is_path else item}"
        if key in _LOADED:
            continue
        shown = f"${PLUGINS_ENV} item {item!r}"
        try:
            if is_path:
                if not path.is_file():
                    raise PluginError(f"{shown}: no such file")
                _import_path(path.resolve())
            else:
                importlib.import_module(item)
        except PluginError as err:
            raise PluginError(str(err) if str(err).startswith(shown) else f"{shown}: {err}") from None
        except Exception as err:  # noqa: BLE001
            raise PluginError(f"{shown} failed to load: {type(err).__name__}: {err}") from None
        _LOADED.add(key)


def sampler_names() -> list[str]:
    """Every registered sampler's name: the platform's five, the research samplers, then the plugins'."""
    load_plugins()
    return sorted(_SAMPLERS, key=lambda n: (n not in BUILTIN, n not in RESEARCH, n))


def specs() -> list[SamplerSpec]:
    """Every registered sampler, in `sampler_names` order."""
    return [_SAMPLERS[name] for name in sampler_names()]


def get_sampler(name: str) -> SamplerSpec:
    """The sampler registered as `name`; `ConfigError` naming `sampler.name` and the choices otherwise."""
    load_plugins()
    spec = _SAMPLERS.get(name)
    if spec is None:
        raise ConfigError(f"sampler.name: unknown sampler {name!r}; choose from {sampler_names()} (a sampler of "
                          f"your own: register it, and name its module in ${PLUGINS_ENV} or an "
                          f"{ENTRY_POINT_GROUP} entry point; docs/SAMPLERS.md)")
    return spec


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """`sampler.options` of a config whose sampler is `name`, validated by the sampler's options model and with
    its defaults filled in; `ValueError` naming `sampler.options.<field>` otherwise."""
    from pydantic import ValidationError

    spec = get_sampler(name)
    if spec.options is None:
        if options:
            raise ValueError(f"sampler.options: sampler {name!r} takes no options; remove {sorted(options)}")
        return {}
    try:
        return spec.options.model_validate(options).model_dump(mode="json")
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            parts.append(f"sampler.options.{loc}: {e['msg']} (got {e.get('input')!r})" if e["type"] != "extra_forbidden"
                         else f"sampler.options.{loc}: sampler {name!r} has no such option (its options: "
                              f"{', '.join(spec.options.model_fields)})")
        raise ValueError("; ".join(parts)) from None


def reads_option(name: str, option: str) -> bool:
    """Whether the sampler `name` has the option `option` (a `sampler.options.<option>` a run of it reads)."""
    spec = get_sampler(name)
    return spec.options is not None and option in spec.options.model_fields


def options_of(cfg: Any) -> Any:
    """The sampler options of `cfg` (a SamplerConfig) as its sampler's options model: typed attribute access."""
    spec = get_sampler(cfg.name)
    if spec.options is None:
        raise ValueError(f"sampler {cfg.name!r} registered no options model")
    return spec.options.model_validate(cfg.options)
