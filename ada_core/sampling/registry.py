"""The sampler registry: every sampler, built-in or a researcher's own, is one class registered by name.

    from ada_core.sampling import SamplerOptions, register_sampler

    class TopKOptions(SamplerOptions):
        k: int = Field(2, ge=1, description="...")

    @register_sampler("topk", options=TopKOptions, presets={"topk": {"advantage": {"name": "global_mean"}}})
    class TopKSampler: ...

`sampler.name: topk` then selects it like `fixed` or `ada`; its options are the config's `sampler.options`,
validated by `TopKOptions` (an unknown or bad option fails naming `sampler.options.<field>`); each preset it
registers is a variant of `ada train --preset`, `ada simulate`, the flows' forms, compare, sweep and the
paper grid. docs/SAMPLERS.md gives the contract (what `sample` returns; state for resume; what the platform
computes) and a worked example (examples/second_chance.py).

Where plugins come from, loaded lazily the first time the registry is read (`load_plugins`):
- the entry-point group `ada_platform.samplers` of every installed package: `name = package.module` (or
  `package.module:Class`), where the module registers a sampler called `name`;
- `$ADA_SAMPLERS`: comma-separated module names (importable from `sys.path`) or paths to `.py` files.
A plugin that fails to import, or registers nothing under its entry point's name, is a `PluginError`
naming the entry point or the `$ADA_SAMPLERS` item, in one line.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ada_core.config.strict import _Strict
from ada_core.errors import ConfigError

ENTRY_POINT_GROUP = "ada_platform.samplers"
PLUGINS_ENV = "ADA_SAMPLERS"
# The methods of `ada_core.protocols.Sampler`, which every registered class must have (docs/SAMPLERS.md).
REQUIRED_METHODS = ("sample", "state_dict", "load_state_dict", "close")
# What a registered preset may set besides `sampler.name`: the algorithm (ada_core/config/presets.py ALGORITHM_FIELDS).
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_PRESET_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class PluginError(ConfigError):
    """A sampler plugin cannot be loaded or registered; the message names it (the CLI exits 2)."""


class SamplerOptions(_Strict):
    """Base of a sampler's own config fields (`sampler.options`): an unknown field is refused, as everywhere
    in the config. Give every field a description: docs and forms show it."""


@dataclass(frozen=True)
class SamplerSpec:
    """One registered sampler: its name (`sampler.name`), class, options model and where it was defined."""

    name: str
    cls: type
    options: type[SamplerOptions] | None
    origin: str
    """`module:Class`, for messages."""
    source: str | None
    """The file that defined the class (the same class loaded twice, by module and by path, is one sampler)."""

    @property
    def builtin(self) -> bool:
        return self.cls.__module__.startswith("ada_core.")


_SAMPLERS: dict[str, SamplerSpec] = {}
_LOADED: set[str] = set()  # entry points and $ADA_SAMPLERS items already imported
_ENTRY_POINTS: list[importlib.metadata.EntryPoint] | None = None


def register_sampler(name: str, *, options: type[SamplerOptions] | None = None,
                     presets: dict[str, dict[str, Any]] | None = None) -> Callable[[type], type]:
    """Class decorator: register the sampler `name` (`sampler.name`).

    - `options`: a `SamplerOptions` subclass, the sampler's own fields (`sampler.options.<field>`); None: it
      takes none, and a config that gives any is refused.
    - `presets`: preset name -> what it sets besides `sampler.name` (`{"sampler": {"n": 4, "options": {...}},
      "advantage": {"name": "global_mean"}}`, algorithm fields only); each becomes a variant everywhere a
      preset is chosen. None: one preset named after the sampler, with every default. The built-in samplers
      pass `{}`: their presets are the platform's own table (ada_core/config/presets.py).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise PluginError(f"register_sampler({name!r}): a sampler name is lower-case letters, digits and _, "
                          "starting with a letter (it is a config value: sampler.name)")

    def wrap(cls: type) -> type:
        origin = f"{cls.__module__}:{cls.__qualname__}"
        from ada_core.protocols import Sampler

        missing = [m for m in REQUIRED_METHODS if m not in dir(cls)]
        if not isinstance(cls, type) or not issubclass(cls, Sampler):
            raise PluginError(f"register_sampler({name!r}) on {origin}: a sampler is a class with "
                              f"{', '.join(REQUIRED_METHODS)}; it lacks {', '.join(missing) or 'being a class'}")
        if options is not None:
            _check_options(name, options)
        source = _source(cls)
        known = _SAMPLERS.get(name)
        if known is not None and not (source is not None and known.source == source
                                      and known.cls.__qualname__ == cls.__qualname__):
            raise PluginError(f"register_sampler({name!r}) on {origin}: the name is taken by {known.origin}; "
                              "choose another name")
        chosen = {name.replace("_", "-"): {}} if presets is None else presets
        _register_presets(name, chosen, replacing=known is not None)
        _SAMPLERS[name] = SamplerSpec(name, cls, options, origin, source)
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


def _register_presets(name: str, presets: dict[str, dict[str, Any]], replacing: bool) -> None:
    from ada_core.config.presets import ALGORITHM_FIELDS, PRESETS
    from ada_core.config.schema import flatten_dotted

    if not isinstance(presets, dict):
        raise PluginError(f"register_sampler({name!r}): presets must be a dict of preset name -> settings")
    built: dict[str, dict[str, Any]] = {}
    for preset, settings in presets.items():
        where = f"register_sampler({name!r}) preset {preset!r}"
        if not isinstance(preset, str) or not _PRESET_NAME.match(preset):
            raise PluginError(f"{where}: a preset name is lower-case letters, digits, '-', '_' and '.'")
        if not isinstance(settings, dict):
            raise PluginError(f"{where}: its settings must be a dict such as "
                              "{'sampler': {'n': 4}, 'advantage': {'name': 'grpo'}}")
        sampler = dict(settings.get("sampler") or {})
        if sampler.get("name", name) != name:
            raise PluginError(f"{where}: sets sampler.name={sampler['name']!r}; a sampler's presets select it")
        entry = {**settings, "sampler": {**sampler, "name": name}}
        entry.setdefault("advantage", {"name": "grpo"})
        outside = [k for k in flatten_dotted(entry) if k not in ALGORITHM_FIELDS and not k.startswith("sampler.options")]
        if outside:
            raise PluginError(f"{where}: sets {outside[0]}, which is not an algorithm field (a preset sets only "
                              f"{', '.join(ALGORITHM_FIELDS[1:])} and sampler.options), so that compared presets "
                              "differ in their algorithm alone")
        owner = PRESETS.get(preset, {}).get("sampler", {}).get("name")
        if preset in PRESETS and not (replacing and owner == name):
            raise PluginError(f"{where}: a preset of that name exists (sampler {owner!r}); choose another name")
        built[preset] = entry
    PRESETS.update(built)


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
    """Import the built-in samplers, every `ada_platform.samplers` entry point and every `$ADA_SAMPLERS` item
    not imported yet; `PluginError` naming the first that fails."""
    import ada_core.sampling.samplers  # noqa: F401 - the built-in samplers register themselves

    global _ENTRY_POINTS
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
    """Every registered sampler's name, built-in ones first."""
    load_plugins()
    return sorted(_SAMPLERS, key=lambda n: (not _SAMPLERS[n].builtin, n))


def get_sampler(name: str) -> SamplerSpec:
    """The sampler registered as `name`; `ConfigError` naming `sampler.name` and the choices otherwise."""
    load_plugins()
    spec = _SAMPLERS.get(name)
    if spec is None:
        raise ConfigError(f"sampler.name: unknown sampler {name!r}; choose from {sampler_names()} (a sampler of "
                          f"your own: register it, and name its module in ${PLUGINS_ENV} or an "
                          f"{ENTRY_POINT_GROUP} entry point; docs/SAMPLERS.md)")
    return spec


def preset_names() -> list[str]:
    """Every preset: the platform's, then those registered samplers brought (`register_sampler(presets=...)`)."""
    from ada_core.config.presets import PRESETS

    load_plugins()
    return list(PRESETS)


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
