"""Engine-side checks that need no model or server: token sampling, config overlays, engine and rank-plan config errors."""

from __future__ import annotations

import math

import pytest
import torch

from ada_core.config import ConfigError, DistributedConfig, build_config
from ada_core.engines.rank_rollout import split_contiguous
from ada_core.engines.transformers_engine import sample_tokens
from ada_core.engines.update_plan import balance_by_tokens
from ada_core.engines.vllm_server import check_engine_config


def test_sample_tokens_worked_example_and_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 4))
    tokens, logprobs = sample_tokens(logits, torch.tensor([0.1, 0.7, 0.99, 0.0]), temperature=1.0, top_p=0.6)
    # nucleus {0, 1} renormalised to [0.625, 0.375]: u < 0.625 -> token 0, else token 1; never token 2
    assert tokens.tolist() == [0, 1, 1, 0]
    assert torch.allclose(logprobs, torch.log(torch.tensor([0.5, 0.3, 0.3, 0.5])))
    full, _ = sample_tokens(logits[:3], torch.tensor([0.1, 0.7, 0.99]), temperature=1.0, top_p=1.0)
    assert full.tolist() == [0, 1, 2]
    zero_prob = torch.tensor([[-math.inf, 0.0, -math.inf]])
    assert sample_tokens(zero_prob, torch.tensor([0.0]), 1.0, 1.0)[0].item() == 1


def test_gpu_overlay_validates_as_a_config_file():
    from pathlib import Path

    from ada_core.config import build_config

    overlay = Path(__file__).resolve().parents[2] / "infra" / "gpu" / "zero2_bf16.yaml"
    cfg = build_config("grpo", "smollm2-135m", config_file=overlay)
    assert cfg.optim.zero_stage == 2 and cfg.optim.precision == "bf16"


def test_vllm_config_errors_name_the_field(monkeypatch, tmp_path):
    sleepy = build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "vllm": {"sleep_during_update": True}}})
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"rollout\.vllm\.sleep_during_update.*CUDA-only"):
            check_engine_config(sleepy)
    monkeypatch.setenv("ADA_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(ConfigError, match=r"rollout\.engine.*make vllm-env"):
        check_engine_config(build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm"}}))
    attach = build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "vllm": {"base_url": "http://127.0.0.1:9"}}})
    check_engine_config(attach)  # attaching needs no local environment


def test_pool_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"rollout\.vllm.*base_url .*or base_urls"):
        build_config("grpo", "tiny", overrides={"rollout": {"vllm": {"base_url": "http://a", "base_urls": ["http://b"]}}})
    with pytest.raises(ConfigError, match=r"num_servers > 1"):
        build_config("grpo", "tiny", overrides={"rollout": {"vllm": {"num_servers": 2, "base_urls": ["http://b"]}}})


def test_split_helpers():
    assert split_contiguous([4, 4, 4, 4], 2) == [(0, 2), (2, 4)]
    assert split_contiguous([9, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert split_contiguous([5], 3) == [(0, 0), (0, 1), (1, 1)]
    assert balance_by_tokens([[0], [1, 2], [3]], [10, 6, 3], 2) == [[0], [1, 2, 3]]
    assert balance_by_tokens([[0, 1]], [4], 2) == [[0, 1], []]


def test_distributed_config_from_the_command_line_and_its_errors():
    from ada_core.config import ConfigError, parse_set

    config = build_config("grpo", "tiny", overrides=parse_set(["distributed.num_ranks=2", "distributed.ray_address=auto"]))
    assert config.distributed.num_ranks == 2 and config.distributed.ray_address == "auto"
    default = build_config("grpo", "tiny").distributed
    assert default.num_ranks == 1 and default.ray_address is None and default.gpus_per_rank == 0
    with pytest.raises(ConfigError, match=r"distributed\.num_ranks"):
        build_config("grpo", "tiny", overrides={"distributed": {"num_ranks": 0}})
    with pytest.raises(ConfigError, match=r"distributed\.placement_strategy"):
        build_config("grpo", "tiny", overrides={"distributed": {"placement_strategy": "ANYWHERE"}})
    for name, field in DistributedConfig.model_fields.items():
        assert field.description, f"distributed.{name} has no description"


def test_async_rollout_is_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: 1 needs rollout\.engine: vllm.*'transformers'"):
        build_config("grpo", "tiny", overrides={"rollout": {"async_steps": 1}, "loss": {"tis_cap": 2.0}})
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: 2 .*set loss\.tis_cap"):
        build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "async_steps": 2}})
    with pytest.raises(ConfigError, match=r"rollout\.async_steps: 1 .*rollout\.vllm\.sleep_during_update"):
        build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "async_steps": 1,
                                                            "vllm": {"sleep_during_update": True}},
                                                "loss": {"tis_cap": 2.0}})
    with pytest.raises(ConfigError, match=r"rollout\.async_steps"):
        build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "async_steps": -1}})
    ok = build_config("ada-balance", "tiny", overrides={"rollout": {"engine": "vllm", "async_steps": 1},
                                                        "sampler": {"schedule": "streaming"}, "loss": {"tis_cap": 2.0}})
    assert ok.rollout.async_steps == 1 and build_config("grpo", "tiny").rollout.async_steps == 0


def test_ranks_across_machines_take_the_interface_that_reaches_the_rendezvous(monkeypatch):
    """gloo and NCCL would take this host's address from its hostname (loopback on many machines); each rank
    is given the interface its route to MASTER_ADDR leaves through, or one set by hand is kept."""
    import psutil

    from ada_core.engines import rendezvous as R

    assert R.interface_of("127.0.0.1") == "lo" and R.route_interface("127.0.0.1") == "lo"
    assert R.interface_of("192.0.2.77") is None
    # This host's own non-loopback address, if it has one, is reached through the interface holding it.
    own = [(name, a.address) for name, addrs in psutil.net_if_addrs().items() for a in addrs
           if a.family.name == "AF_INET" and not a.address.startswith("127.")]
    if own:
        assert R.route_interface(own[0][1]) == own[0][0]
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", R.RENDEZVOUS_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert R.rendezvous_method() is None  # across machines: env://, on the interface found
    assert R.os.environ["GLOO_SOCKET_IFNAME"] == R.os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # named by hand: kept
    R.rendezvous_method()
    assert R.os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
    def no_route(*args, **kwargs):
        raise OSError("no route")

    monkeypatch.setattr(R.socket, "getaddrinfo", no_route)  # an address with no route: the libraries' own choice
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    assert R.rendezvous_method() is None and "NCCL_SOCKET_IFNAME" not in R.os.environ
