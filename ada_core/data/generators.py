"""Seeded prompt generators: the tiny model's `a+b=` arithmetic and reasoning-gym's tasks (optionally at a
curriculum level).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ada_core.errors import DatasetError
from ada_core.records import Prompt


# ---------------------------------------------------------------------------------------------
# Generators


def arithmetic_prompts(size: int, seed: int, difficulty: int | None = None, distinct: bool = True) -> list[Prompt]:
    """`size` distinct `a+b=` problems; operands have 1..difficulty digits (default 3).

    Each operand draws its digit count uniformly, then a value with that many digits (0-9 for one
    digit), so short and long operands are equally common. `prompt.difficulty` is the larger
    operand's digit count. Example: `Prompt(text="12+345=", answer="357", difficulty=3.0)`.
    `distinct=False` keeps repeats: `size` independent draws, as a stream of fresh problems gives
    (a distinct draw as large as the space of short sums is skewed towards long operands).
    """
    max_digits = 3 if difficulty is None else int(difficulty)
    if not 1 <= max_digits <= 6:
        raise DatasetError(f"arithmetic difficulty is the max operand digits, 1..6; got {difficulty}")
    space = (10**max_digits) ** 2
    if distinct and size > space:
        raise DatasetError(f"arithmetic with up to {max_digits} digits has only {space} distinct problems; "
                         f"asked for {size}")
    rng = random.Random(seed)

    def operand() -> int:
        digits = rng.randint(1, max_digits)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    seen: set[tuple[int, int]] = set()
    prompts = []
    while len(prompts) < size:
        a, b = operand(), operand()
        if distinct and (a, b) in seen:
            continue
        seen.add((a, b))
        prompts.append(Prompt(
            id=f"arithmetic/d{max_digits}/s{seed}/{len(prompts)}",
            text=f"{a}+{b}=",
            answer=str(a + b),
            source="arithmetic",
            difficulty=float(max(len(str(a)), len(str(b)))),
            meta={"answer_format": "plain"},
        ))
    return prompts


def slipped_sum(a: int, b: int, slip: float, rng: random.Random) -> int:
    """`a + b` added digit by digit, each carry dropped with chance `slip` (non-negative operands).

    >>> slipped_sum(58, 67, 0.0, random.Random(0)), slipped_sum(58, 67, 0.999999, random.Random(0))
    (125, 15)
    """
    total, carry, place = 0, 0, 1
    while a or b or carry:
        digit = a % 10 + b % 10 + carry
        total += (digit % 10) * place
        carry = digit // 10
        if carry and rng.random() < slip:
            carry = 0
        a, b, place = a // 10, b // 10, place * 10
    return total


def slip_carries(prompts: list[Prompt], slip: float, seed: int) -> list[Prompt]:
    """`a+b=` prompts with their answers replaced by `slipped_sum` targets (seeded); `slip` 0 returns them as given."""
    if slip <= 0:
        return prompts
    rng = random.Random(seed)
    out = []
    for p in prompts:
        a, b = (int(x) for x in p.text.rstrip("=").split("+"))
        out.append(Prompt(id=p.id, text=p.text, answer=str(slipped_sum(a, b, slip, rng)), source=p.source,
                          difficulty=p.difficulty, meta=dict(p.meta)))
    return out


# Maths tasks of reasoning-gym that run offline and whose answers math-verify parses.
REASONING_GYM_TASKS = (
    "basic_arithmetic", "chain_sum", "products", "gcd", "lcm", "simple_equations", "fraction_simplification",
)


def reasoning_gym_prompts(task: str, size: int, seed: int, difficulty: int | None = None) -> list[Prompt]:
    """`size` distinct problems of a reasoning-gym task at curriculum level `difficulty` (default 0).

    A level sets every curriculum attribute (terms, digits, ...) to that level or its top, in
    reasoning-gym's inclusive mode: level 2 draws from levels 0-2. See `reasoning_gym_levels`.
    """
    from reasoning_gym.factory import DATASETS, create_curriculum

    level = 0 if difficulty is None else int(difficulty)
    top = reasoning_gym_levels(task)
    if not 0 <= level <= top:
        raise DatasetError(f"{task}: difficulty is a curriculum level 0..{top}; got {difficulty}")
    curriculum = create_curriculum(task)
    curriculum.set_global_level(level)
    max_draws = 20 * size + 100
    config = curriculum.generate_configuration({"seed": seed, "size": max_draws})
    dataset = DATASETS[task][0](config=config)
    seen: set[str] = set()
    prompts = []
    for idx in range(max_draws):
        entry = dataset[idx]
        question = entry["question"].strip()
        if question in seen:
            continue
        seen.add(question)
        prompts.append(Prompt(
            id=f"{task}/L{level}/s{seed}/{idx}",
            text=question,
            answer=str(entry["answer"]).strip(),
            source=f"reasoning_gym/{task}",
            difficulty=float(level),
            meta={"answer_format": "boxed", "level": level},
        ))
        if len(prompts) == size:
            return prompts
    raise DatasetError(f"{task} level {level}: found only {len(prompts)} distinct problems in {max_draws} draws; "
                     f"asked for {size}")


def reasoning_gym_levels(task: str) -> int:
    """The highest curriculum level of a reasoning-gym task."""
    if task not in REASONING_GYM_TASKS:
        raise DatasetError(f"unknown reasoning-gym task {task!r}; choose from {list(REASONING_GYM_TASKS)}")
    from reasoning_gym.factory import create_curriculum

    return max(len(attr.levels) for attr in create_curriculum(task).attributes.values()) - 1


GENERATORS: dict[str, Callable[..., list[Prompt]]] = {"arithmetic": arithmetic_prompts}
for _task in REASONING_GYM_TASKS:
    GENERATORS[_task] = lambda size, seed, difficulty=None, _t=_task: reasoning_gym_prompts(_t, size, seed, difficulty)


def generate_prompts(name: str, size: int, seed: int, difficulty: int | None = None) -> list[Prompt]:
    """Seeded prompts from a generator (`arithmetic` or a reasoning-gym task; `reasoning_gym/` optional)."""
    key = name.removeprefix("reasoning_gym/")
    if key not in GENERATORS:
        raise DatasetError(f"unknown generator {name!r}; choose from {sorted(GENERATORS)}")
    if size < 1:
        raise DatasetError(f"{name}: size must be >= 1, got {size}")
    return GENERATORS[key](size, seed, difficulty)
