"""Where each config field applies: the one source for MLflow's `n/a`, docs/CONFIG.md and validation.

Every leaf field of the schema declares, next to its description, when a run reads it:

    M: int = Field(8, ge=1, description="...", json_schema_extra=when("sampler.name in [ada, budgeted]"))
    seed: int = Field(0, description="...", json_schema_extra=ALWAYS)
    preset: str = Field("grpo", description="...", json_schema_extra=LABEL)

- `ALWAYS`: every run reads it.
- `LABEL`: no run reads it; it names or describes the run (logged, shown, never acted on).
- `when(clause, ...)`: the run reads it only when every clause holds. A clause is
  `<path> <op> <value>`: `path` a dotted config field (`sampler.name`) or a fact about the run that
  the config does not hold (`run.curate`: the flow curates first; `run.device`: `cpu` or `cuda`),
  `op` one of `==`, `!=`, `in`, `>`, `>=`, and `value` YAML (`ada`, `[ada, budgeted]`, `null`, `[]`, `1`).

The metadata lands in the JSON schema too (`applies`), so Prefect's form carries it. A rule that needs a run
fact its caller did not give cannot be decided, and is never taken as holding: a field set by the user whose
rule cannot be decided is refused (`unread_set_fields`), and `holds`/`not_applicable` raise `Undecided`.
Whoever builds a run's config knows its facts and passes them (`run_facts`): `ada train` never curates; the
train flow curates when `curate` is true.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import yaml

from ada_core import metrics

KEY = "applies"
ALWAYS: dict[str, Any] = {KEY: "always"}
LABEL: dict[str, Any] = {KEY: "label"}
RUN_FACTS = {"run.curate": (True, False), "run.device": ("cpu", "cuda")}


class Undecided(ValueError):
    """An applicability rule names a run fact its caller did not give: whether the run reads the field is unknown."""


def this_device() -> str:
    """`run.device` of a run on this machine: `cuda` when torch sees a GPU, else `cpu`."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_facts(curate: bool, device: str | None = None) -> dict[str, Any]:
    """Every run fact (RUN_FACTS) of a run that curates first or not, on `device` (default: this machine's)."""
    return {"run.curate": bool(curate), "run.device": device or this_device()}

_OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, ">": operator.gt,
        "in": lambda value, allowed: value in allowed}
_CLAUSE = re.compile(r"^\s*(?P<path>[A-Za-z_][\w.]*)\s+(?P<op>==|!=|>=|>|in)\s+(?P<value>.+?)\s*$")


@dataclass(frozen=True)
class Atom:
    """`<path> <op> <value>`: one comparison of a config field (or a run fact) with a value."""

    path: str
    op: str
    value: Any

    @classmethod
    def parse(cls, text: str) -> Atom:
        match = _CLAUSE.match(text)
        if match is None:
            raise ValueError(f"applicability clause {text!r}: expected `<dotted path> <op> <value>` with op one of "
                             f"{', '.join(_OPS)}, e.g. `sampler.name in [ada, budgeted]`")
        value = yaml.safe_load(match["value"])
        if match["op"] == "in" and not isinstance(value, list):
            raise ValueError(f"applicability clause {text!r}: `in` needs a list, e.g. [ada, budgeted]")
        return cls(match["path"], match["op"], value)

    def truth(self, config: Any, facts: dict[str, Any]) -> bool | None:
        """Whether the comparison holds; None when it names a run fact `facts` does not give."""
        if self.path.startswith("run."):
            if facts.get(self.path) is None:
                return None  # unknown: undecided, never taken as holding
            actual = facts[self.path]
        else:
            actual = lookup(config, self.path)
        return bool(_OPS[self.op](actual, self.value))

    def __str__(self) -> str:
        return f"{self.path} {self.op} {_show(self.value)}"


@dataclass(frozen=True)
class Clause:
    """`<atom>` or `<atom> or <atom> ...`: holds when any of its atoms does."""

    atoms: tuple[Atom, ...]

    @classmethod
    def parse(cls, text: str) -> Clause:
        return cls(tuple(Atom.parse(part) for part in text.split(" or ")))

    @property
    def paths(self) -> list[str]:
        return [a.path for a in self.atoms]

    def truth(self, config: Any, facts: dict[str, Any]) -> bool | None:
        """True when an atom holds, False when none does, None when none holds and one is undecided."""
        truths = [a.truth(config, facts) for a in self.atoms]
        return True if True in truths else None if None in truths else False

    def holds(self, config: Any, facts: dict[str, Any]) -> bool:
        return _decided(self.truth(config, facts), self, facts)

    def __str__(self) -> str:
        return " or ".join(str(a) for a in self.atoms)


def lookup(config: Any, dotted: str) -> Any:
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _show(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def when(*clauses: str) -> dict[str, Any]:
    """Field metadata: the field applies only when every clause holds (the module docstring)."""
    if not clauses:
        raise ValueError("when(): give at least one clause, or use ALWAYS")
    for clause in clauses:
        Clause.parse(clause)  # a typo fails at import, naming the clause
    return {KEY: list(clauses)}


@dataclass(frozen=True)
class Applies:
    """One field's applicability: `always`, `label`, or the clauses that must all hold."""

    kind: str  # "always" | "label" | "when"
    clauses: tuple[Clause, ...] = ()

    def truth(self, config: Any, facts: dict[str, Any] | None = None) -> bool | None:
        """Whether a run of `config` reads the field (a label: False, it is never read); None when that
        depends on a run fact `facts` does not give."""
        if self.kind == "label":
            return False
        truths = [c.truth(config, facts or {}) for c in self.clauses]
        return False if False in truths else None if None in truths else True

    def holds(self, config: Any, facts: dict[str, Any] | None = None) -> bool:
        """`truth`, or `Undecided` naming the run facts it needs."""
        return _decided(self.truth(config, facts), self, facts or {})

    def unknown_facts(self, facts: dict[str, Any] | None = None) -> list[str]:
        """The run facts this rule names that `facts` does not give."""
        return list(dict.fromkeys(p for c in self.clauses for p in c.paths
                                  if p.startswith("run.") and (facts or {}).get(p) is None))

    def __str__(self) -> str:
        return self.kind if self.kind != "when" else " and ".join(str(c) for c in self.clauses)


def _decided(truth: bool | None, rule: Any, facts: dict[str, Any]) -> bool:
    if truth is None:
        paths = [p for p in (rule.paths if isinstance(rule, Clause) else
                             [p for c in rule.clauses for p in c.paths]) if p.startswith("run.")]
        unknown = ", ".join(dict.fromkeys(p for p in paths if facts.get(p) is None))
        raise Undecided(f"`{rule}` cannot be decided: {unknown} not given (pass run_facts)")
    return truth


def _of(extra: Any) -> Applies | None:
    declared = extra.get(KEY) if isinstance(extra, dict) else None
    if declared in ("always", "label"):
        return Applies(declared)
    if isinstance(declared, list) and declared:
        return Applies("when", tuple(Clause.parse(c) for c in declared))
    return None


def leaf_fields(model: type, prefix: str = "") -> dict[str, Any]:
    """Dotted name -> pydantic FieldInfo of every leaf field of `model` (nested sections walked)."""
    from pydantic import BaseModel

    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.update(leaf_fields(annotation, f"{dotted}."))
        else:
            out[dotted] = info
    return out


def applicability(model: type) -> dict[str, Applies | None]:
    """Dotted name -> `Applies` of every leaf field of `model` (TrainConfig); None where a field declares nothing."""
    return {name: _of(info.json_schema_extra) for name, info in leaf_fields(model).items()}


def not_applicable(config: Any, facts: dict[str, Any]) -> set[str]:
    """Dotted names of the fields a run of `config` does not read (labels excluded: they are logged as given).
    `facts`: the run's (`run_facts`); a rule they leave undecided raises `Undecided`, naming the field."""
    out: set[str] = set()
    for name, rule in applicability(type(config)).items():
        if rule is None or rule.kind != "when":
            continue
        truth = rule.truth(config, facts)
        if truth is None:
            raise Undecided(f"{name}: whether this run reads it cannot be decided: it applies only when {rule}, "
                            f"and {', '.join(rule.unknown_facts(facts))} is not given")
        if not truth:
            out.add(name)
    return out


def unread_set_fields(config: Any, given: dict[str, Any], facts: dict[str, Any] | None = None) -> list[str]:
    """Why each field the user set (`given`: nested, as from a config file or `--set`) is never read by a run
    of `config` with run facts `facts` (`run_facts`), one line per field, naming it and where it applies. A
    field whose rule needs a fact `facts` does not give is refused too: it cannot be shown to be read."""
    rules = applicability(type(config))
    facts = facts or {}
    problems: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict) and dotted not in rules:
                walk(value, f"{dotted}.")
            elif (rule := rules.get(dotted)) is None or rule.kind != "when":
                continue
            elif (truth := rule.truth(config, facts)) is None:
                problems.append(f"{dotted}: set to {value!r}, but whether this run reads it cannot be decided: it "
                                f"applies only when {rule}, and {', '.join(rule.unknown_facts(facts))} is not known "
                                "where this config is built; remove it or set it where the run's facts are known")
            elif not truth:
                problems.append(f"{dotted}: set to {value!r}, but this run never reads it: it applies only when "
                                f"{rule} (here {_actual(config, rule, facts)}); remove it or change the run")

    walk(given, "")
    return problems


def _actual(config: Any, rule: Applies, facts: dict[str, Any]) -> str:
    paths = dict.fromkeys(p for c in rule.clauses for p in c.paths)
    return ", ".join(f"{p} = {_show(facts[p] if p.startswith('run.') else lookup(config, p))}"
                     + (": this run does not curate its prompts first" if p == "run.curate" and not facts[p] else "")
                     for p in paths if not p.startswith("run.") or facts.get(p) is not None)


def config_table(model: type) -> str:
    """docs/CONFIG.md: every leaf field of `model` (TrainConfig), its default, where it applies, its description."""
    from pydantic_core import PydanticUndefined

    lines = [
        "# Config reference (generated)",
        "",
        "Generated from `ada_core/config/schema.py` by `python -m ada_core.config > docs/CONFIG.md`;",
        "`tests/fast/test_every_field.py` fails when it is stale. **applies** says when a run reads the field",
        "(ada_core/config/applies.py): `always`; `label` (named and logged, never acted on); or the clauses",
        "that must all hold (`run.curate`: the flow curates first; `run.device`: the machine). Where it does",
        "not hold, MLflow logs the field as `n/a` and a config file or `--set` that sets it is refused.",
        "",
        "| field | default | applies | description |",
        "|---|---|---|---|",
    ]
    rules = applicability(model)
    for name, info in leaf_fields(model).items():
        default = info.get_default(call_default_factory=True) if info.default is not PydanticUndefined or \
            info.default_factory is not None else ""
        description = (info.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{name}` | `{default!r}` | {rules[name] or '**missing**'} | {description} |")
    return "\n".join(lines) + "\n"


def metrics_off(config: Any) -> frozenset[str]:
    """The metric keys of the features a run of `config` leaves off (`ada_core.metrics.WHEN_ON`): a run never
    logs them, so MLflow draws no chart of a feature the run does not use."""
    return frozenset(key for clause, keys in metrics.WHEN_ON.items()
                     if not Clause.parse(clause).holds(config, {}) for key in keys)  # a run fact: Undecided
