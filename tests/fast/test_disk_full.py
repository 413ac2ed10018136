"""A disk that fills during one of the platform's big writes is one line naming the folder and the space
needed, and no partial file or folder is left holding the space (ada_core.paths.staged): model builds
(the tiny model here; SFT warm starts and hub conversions write through the same atomic_build), a KL
run's reference weights, curated sets, the vLLM weight-sync folder. Each runs on a real file system of
a few MB that the write fills. (Checkpoints: tests/model/test_resume.py, through `ada train`.)"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

from ada_core.errors import DiskFull
from ada_core.paths import staged

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")


@pytest.fixture()
def disk(tmp_path):
    """A 1 MB file system (tmpfs) of the test's own: smaller than the tiny model's 1.6 MB of weights."""
    folder = tmp_path / "disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _one_line(failure, folder, what: str) -> str:
    message = str(failure.value)
    assert "\n" not in message, message
    assert message.startswith(f"no space left in {folder} for {what}: it needs "), message
    return message


def _left(folder) -> list[str]:
    """What is in `folder`, its lock files aside; the disk's space must be free again too (an unlinked
    file a failed writer still holds open would keep it)."""
    assert shutil.disk_usage(folder).used < 64 << 10, shutil.disk_usage(folder)
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_a_failed_write_removes_what_it_wrote_and_only_a_full_disk_becomes_disk_full(disk):
    with pytest.raises(DiskFull) as failure:
        with staged(disk / "big.pt.tmp", "a big tensor") as partial:
            torch.save(torch.zeros(1 << 19), partial)  # 2 MB: torch reports the full disk as a RuntimeError
    message = _one_line(failure, disk, "a big tensor")
    assert "it needs more than the" in message and "the partial big.pt.tmp was removed" in message
    assert _left(disk) == []
    with pytest.raises(DiskFull, match=r"it needs about 3\.0 MB, .* free when the write failed"):
        with staged(disk / ".tmp_dir", "three files", needs=3_000_000) as partial:
            partial.mkdir()
            for name in "abc":
                (partial / name).write_bytes(b"\0" * 1_000_000)
    assert _left(disk) == []
    with pytest.raises(ValueError, match="not about space"):  # any other failure is itself, its partial removed
        with staged(disk / ".tmp_small", "a small file") as partial:
            partial.write_text("x")
            raise ValueError("not about space")
    assert _left(disk) == []


def test_a_model_build_on_a_full_disk(disk):
    from ada_core.models.build import build_tiny

    with pytest.raises(DiskFull) as failure:
        build_tiny(disk / "models" / "tiny")
    _one_line(failure, disk / "models", "the model folder tiny")
    assert _left(disk / "models") == []


def test_the_reference_weights_of_a_kl_run_on_a_full_disk(disk, tiny_model):
    from ada_core.run.reference import keep_reference

    run = disk / "run"
    run.mkdir()
    with pytest.raises(DiskFull) as failure:
        keep_reference(tiny_model, run)  # another file system: copied, not linked
    assert "it needs about 1.6 MB" in _one_line(failure, run, "the KL reference weights")
    assert _left(run) == []


def test_a_curated_set_on_a_full_disk(disk):
    from ada_core.data.curation import CurationResult, save_curated
    from ada_core.records import Prompt

    prompts = [Prompt(id=f"p{i}", text="x" * 2000, answer="1") for i in range(1000)]  # 2 MB of text
    out = disk / "curated"
    with pytest.raises(DiskFull) as failure:
        save_curated(CurationResult(prompts=prompts, report={}), out)
    _one_line(failure, out, "the curated set curated")
    assert _left(out) == []


def test_the_weight_sync_folder_on_a_full_disk(disk, tiny_model):
    from transformers import AutoModelForCausalLM

    from ada_core.engines.vllm_engine import write_weights

    module = AutoModelForCausalLM.from_pretrained(tiny_model)
    with pytest.raises(DiskFull) as failure:
        write_weights(module, disk / "v3", version=3)
    assert "it needs about 1.6 MB" in _one_line(failure, disk, "the weights of version 3")
    assert _left(disk) == []
