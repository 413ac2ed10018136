"""What answers built to hang cost one verify call, without and with a batch deadline.

A batch of `--good` answers math-verify checks in milliseconds and `--towers` power towers
(`\\boxed{9^{9^{9^{9^{9}}}}}`, which sympy never finishes) goes to a MathVerifier with its default
per-answer timeout (5 s) and 2 workers, once with no deadline (each tower costs its timeout and a
worker restart) and once with `within_s` (what `verifier.step_budget_s` gives a step's calls).

    python benchmarks/verifier_deadline.py            # about a minute here; JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import time

from ada_core.records import Prompt
from ada_core.rl.rewards import MathVerifier

TOWER = r"\boxed{9^{9^{9^{9^{9}}}}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--good", type=int, default=4)
    parser.add_argument("--towers", type=int, default=8)
    parser.add_argument("--within-s", type=float, default=3.0)
    args = parser.parse_args()
    good = (Prompt(id="good", text="?", answer=r"\frac{1}{2}"), r"\boxed{0.5}")
    items = [good] * args.good + [(Prompt(id="tower", text="?", answer="3"), TOWER)] * args.towers
    rows = []
    with MathVerifier(timeout_s=5.0, workers=2) as verifier:
        for within_s in (None, args.within_s):
            verifier.verify([good] * 2)  # the workers are up before the clock starts
            start = time.monotonic()
            verdicts = verifier.verify(items, within_s=within_s)
            statuses = [v.status.value for v in verdicts]
            rows.append({"within_s": within_s, "seconds": round(time.monotonic() - start, 1),
                         "statuses": {s: statuses.count(s) for s in sorted(set(statuses))}})
    print(json.dumps({"good": args.good, "towers": args.towers, "timeout_s": 5.0, "workers": 2, "runs": rows},
                     indent=1))


if __name__ == "__main__":
    main()
