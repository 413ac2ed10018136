"""Is the testbed's start the same everywhere? Its warm start and curation in fresh homes, one process each,
under the CPU kernels torch can be told to use (docs/benchmarks/testbed.md, reproducibility).

    .venv/bin/python benchmarks/testbed_reproducibility.py --kernels native native avx2 default mkl-avx2

Each run: a fresh ADA_HOME, the testbed profile's SFT recipe for `--sft-steps` steps, then a curation of
`--pool` prompts at k = 16 with the profile's band. It prints one JSON line per run: the weights' sha256,
the curated prompts' digest and how many were kept. Two `native` runs show what one machine repeats; the
other kernels stand in for other CPUs (a machine without AVX-512 runs torch's AVX2 kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {
    "native": {},  # what torch picks on this CPU
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2"},  # torch's own kernels at AVX2
    "default": {"ATEN_CPU_CAPABILITY": "default"},  # torch's own kernels without vector extensions
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},  # the BLAS at AVX2
    # the BLAS at plain AVX-512: no AVX512-FP16, BF16 or AMX paths a newer Xeon would add
    "mkl-avx512": {"MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}

ONE_RUN = r"""
import json, sys
from ada_core.config import build_config
from ada_core.config.schema import data_seed
from ada_core.data import load_prompts, prompts_digest
from ada_core.models import weights_sha256
from ada_core.training.start import curate_for_model

steps, pool = int(sys.argv[2]), int(sys.argv[3])
config = build_config("grpo", "testbed", overrides={"sft_steps": steps})
made = curate_for_model(config.model, config.sft_steps, config.data.dataset, pool_size=pool, k=16, ceiling=1.0,
                        seed=data_seed(config), max_tokens=config.rollout.max_tokens, temperature=1.0,
                        positive_threshold=config.sampler.positive_threshold, micro_batch_size=256,
                        out_dir=sys.argv[1], sft=config.sft.model_dump(), band=config.data.keep_pass_rate,
                        shipped=False)
kept = load_prompts(sys.argv[1])
print(json.dumps({"weights_sha256": weights_sha256(made["model"])[:16], "kept": len(kept),
                  "curated_digest": prompts_digest(kept)}))
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["native", "native", "avx2"], choices=list(KERNELS))
    parser.add_argument("--sft-steps", type=int, default=50)
    parser.add_argument("--pool", type=int, default=256)
    args = parser.parse_args(argv)
    for kernel in args.kernels:
        with tempfile.TemporaryDirectory(prefix="testbed_repro_") as home:
            env = {**os.environ, **KERNELS[kernel], "ADA_HOME": home, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(ROOT)}
            done = subprocess.run([sys.executable, "-c", ONE_RUN, str(Path(home) / "curated"), str(args.sft_steps),
                                   str(args.pool)], env=env, capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                raise SystemExit(f"{kernel}: {done.stderr.strip().splitlines()[-1]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps({"kernels": kernel, **KERNELS[kernel], **row}), flush=True)


if __name__ == "__main__":
    main()
