"""What an update engine reads and writes besides its weights: its state file, and its reference policy.

The optimizer state of a checkpoint (`STATE_FILE`: optimizer, scheduler, step counters, shuffle RNG)
is written as tensors and plain values only (`plain`, `save_state`) and read back with
`torch.load(weights_only=True)` (`load_state`), so a resume pointed at a folder someone else wrote
runs none of its code; a file that needs more is refused with `UnsafeStateError`. DeepSpeed's
optimizers hold a few Python objects their `load_state_dict` does not need; `optimizer_state` leaves
them out. State saved by another number of ranks is refused (`check_world_size`).

`load_reference` loads the frozen reference policy an engine is built with when `loss.kl_coef > 0`.

Apart from the engine (deepspeed_engine.py) because the driver reads and writes these too: the
trainer's resume (training/state.py), the rank group's own state file beside its ranks' (rank_group.py),
and the reference policy of the one-rank engine (factory.py) and of each rank (rank_worker.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ada_core.errors import InputError

STATE_FILE = "update_engine.pt"


class UnsafeStateError(InputError, ValueError):
    """A state file that holds more than tensors and plain values: it is not unpickled (that could run code)."""


# Keys of DeepSpeed's ZeRO and bf16 optimizer state that hold Python objects its `load_state_dict` does
# not need: the loss scaler (a static scale of 1 in fp32 and bf16, which the optimizer re-creates when
# it is built and keeps when the key is absent) and the parameter slice mappings (read only by
# DeepSpeed's offline universal-checkpoint conversion).
_OBJECT_KEYS = ("loss_scaler", "param_slice_mappings")


def optimizer_state(optimizer) -> dict:
    """The optimizer's state dict without `_OBJECT_KEYS`, so `save_state` can write it."""
    return {k: v for k, v in optimizer.state_dict().items() if k not in _OBJECT_KEYS}


def plain(value, where: str = "state"):
    """`value` as tensors, numbers, strings, None and lists, tuples and dicts of them: what
    `torch.load(weights_only=True)` reads back without running code. Enums (DeepSpeed's ZeRO stage)
    become their values; anything else is a TypeError naming where it is."""
    import enum

    if value is None or isinstance(value, torch.Tensor | bool | str):
        return value
    if isinstance(value, enum.Enum):
        return plain(value.value, where)
    if isinstance(value, int | float):
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise TypeError(f"{where}: key {key!r} is a {type(key).__name__}, not a str or int")
            out[key] = plain(item, f"{where}.{key}")
        return out
    if isinstance(value, list | tuple):
        return type(value)(plain(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise TypeError(f"{where}: a {type(value).__module__}.{type(value).__name__} is not a tensor or plain value")


def save_state(state: dict, path: Path) -> None:
    """`state` (see `plain`) to `path` with torch.save; `load_state` reads it with weights_only=True."""
    torch.save(plain(state), path)


def load_state(path: Path):
    """A file `save_state` wrote, read with `torch.load(weights_only=True)`: tensors and plain values only.
    A file that needs more (one written before checkpoints were tensors-only, or not by this platform)
    is refused with `UnsafeStateError` rather than unpickled."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnsafeStateError(
            f"{path} holds Python objects besides tensors and plain values, so it is not loaded (unpickling it "
            "could run code): it was written before checkpoints were tensors-only, or not by this platform. "
            f"Start the run again from its config, or from its checkpoint's hf/ weights ({first})") from None


def load_reference(reference_dir: str | Path):
    """The frozen reference policy in `reference_dir` (float32 on the CPU; the engine moves and casts it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32).eval().requires_grad_(False)


def check_world_size(path: Path, saved: int, current: int) -> None:
    """Refuse optimizer state saved by another number of ranks: ZeRO partitions it by rank, and even
    replicated state would resume on another data split."""
    if saved != current:
        raise ValueError(f"{path} was saved by {saved} training rank(s), but distributed.num_ranks={current}: "
                         f"resume with distributed.num_ranks={saved}")
