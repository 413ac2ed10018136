"""The training prompts as an endless, seeded, reshuffling stream with a resumable cursor."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from ada_core.records import Prompt


class PromptSource:
    """An endless, seeded, reshuffling iterator over prompts with a resumable cursor.

    Each epoch is a fresh permutation drawn from `seed + epoch`, so the cursor (epoch, position) is
    all a checkpoint needs to resume on exactly the same next prompts.
    """

    def __init__(self, prompts: Sequence[Prompt], seed: int = 0, shuffle: bool = True):
        if not prompts:
            raise ValueError("PromptSource needs at least one prompt")
        self._prompts = list(prompts)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self._prompts)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def __len__(self) -> int:
        return len(self._prompts)

    @property
    def prompts(self) -> list[Prompt]:
        """The training prompts in their input order (not the epoch's order)."""
        return list(self._prompts)

    def take(self, k: int) -> list[Prompt]:
        """The next k distinct prompts. A batch never straddles two epochs: when fewer than k are left,
        the rest of the epoch is skipped (drop-last), so a step never sees one prompt twice."""
        if k > len(self._prompts):
            raise ValueError(f"prompts_per_step={k} exceeds the {len(self._prompts)} training prompts")
        if self.position + k > len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        out = [self._prompts[i] for i in self._order[self.position : self.position + k]]
        self.position += k
        return out

    @property
    def digest(self) -> str:
        """sha256 of the prompts (id, text, answer) in input order: a cursor only means something over them."""
        h = hashlib.sha256()
        for p in self._prompts:
            h.update(f"{p.id}\x1f{p.text}\x1f{p.answer}\x1e".encode())
        return h.hexdigest()

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "size": len(self._prompts),
                "digest": self.digest}

    def mismatch(self, state: dict[str, Any]) -> str | None:
        """Why a saved cursor cannot continue on these prompts, or None when it can."""
        if state.get("size", len(self._prompts)) != len(self._prompts):
            return (f"the prompt cursor was saved over {state['size']} training prompts but the data now gives "
                    f"{len(self._prompts)}")
        if state.get("digest", self.digest) != self.digest:
            return f"the {len(self._prompts)} training prompts differ from those the prompt cursor was saved over"
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        problem = self.mismatch(state)
        if problem is not None:
            raise ValueError(f"{problem}: resume with the same dataset")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)
