"""cluster.yaml is a config `ray up` accepts, with the node layout pooljobs relies on.

Validation is Ray's own, offline. `ray up` resolves a config in four steps
(`ray.autoscaler._private.commands._bootstrap_config`):

1. `prepare_config`: merge in the provider's defaults.yaml, merge setup commands, fill
   per-node-type min/max workers. Local only: for AWS it reads a file in the ray package.
2. `fillout_available_node_types_resources`: EC2 DescribeInstanceTypes through boto3
   (credentials + network; `ray up` only warns when it fails).
3. `validate_config`: the ray-schema.json JSON schema plus cross-field checks.
4. `bootstrap_config`: IAM role, key pair, security group, subnets (boto3, creates things).

We run 1 and 3 only, with boto3 made unimportable to prove nothing reaches AWS. Skipping 2
is sound because both node types declare their resources explicitly.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"

# vCPUs of the AWS single-GPU instance types (one GPU from xlarge through 16xlarge; the
# 12xlarge/24xlarge/48xlarge sizes carry 4 or 8 GPUs and are deliberately absent).
_SINGLE_GPU_VCPUS = {
    f"{family}.{size}": vcpus
    for family in ("g4dn", "g5", "g6", "g6e")
    for size, vcpus in (("xlarge", 4), ("2xlarge", 8), ("4xlarge", 16), ("8xlarge", 32), ("16xlarge", 64))
}
_ACCELERATOR_FAMILY = re.compile(r"^(g\d|p\d|inf\d|trn\d|dl\d)")


def _load() -> dict:
    with open(CLUSTER_YAML) as f:
        return yaml.safe_load(f)


def _prepare_and_validate(config: dict) -> dict:
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture
def offline(monkeypatch):
    """Any import of boto3/botocore (the way to AWS) fails while the test runs."""
    for name in [m for m in sys.modules if m == "boto3" or m.startswith(("boto3.", "botocore"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setitem(sys.modules, "botocore", None)


@pytest.fixture
def config() -> dict:
    return _load()


@pytest.fixture
def prepared(config, offline) -> dict:
    return _prepare_and_validate(config)


def _worker_types(cfg: dict) -> dict:
    return {name: t for name, t in cfg["available_node_types"].items() if name != cfg["head_node_type"]}


def test_ray_validates_cluster_yaml(prepared):
    assert prepared["provider"]["type"] == "aws"
    assert "docker" not in _load(), "pooljobs runs on the host; no docker section"


def test_one_gpu_worker_type_scaling_from_zero(config, prepared):
    workers = _worker_types(config)
    assert len(workers) == 1, f"expected one GPU worker type, got {sorted(workers)}"
    (name, worker), = workers.items()
    assert worker["resources"].get("GPU") == 1, f"{name} must declare exactly one GPU per node"
    instance = worker["node_config"]["InstanceType"]
    assert instance in _SINGLE_GPU_VCPUS, f"{name}: {instance} is not a known single-GPU instance type"
    assert worker["resources"].get("CPU") == _SINGLE_GPU_VCPUS[instance], f"{name}: CPU must be {instance}'s vCPUs"
    assert worker["min_workers"] == 0
    assert 0 < prepared["available_node_types"][name]["max_workers"] <= prepared["max_workers"]
    assert prepared["idle_timeout_minutes"] > 0


def test_head_has_no_gpu_and_takes_no_work(config):
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert head["resources"].get("CPU") == 0, "the head keeps actors off it with CPU: 0"
    assert not _ACCELERATOR_FAMILY.match(head["node_config"]["InstanceType"]), "the head is a CPU instance"


def test_dashboard_on_head_loopback(prepared):
    start = " ".join(prepared["head_start_ray_commands"])
    assert "--head" in start
    assert "--dashboard-host=127.0.0.1" in start
    assert "--dashboard-port=8265" in start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in start
    assert any("ray start --address=$RAY_HEAD_IP:6379" in c for c in prepared["worker_start_ray_commands"])


def test_setup_installs_the_mounted_checkout(prepared):
    mounts = {remote: local for remote, local in prepared["file_mounts"].items()}
    remote = next(r for r, local in mounts.items() if local == ".")
    for commands in (prepared["head_setup_commands"], prepared["worker_setup_commands"]):
        assert any(f"-e {remote}" in c for c in commands), f"setup must install the checkout mounted at {remote}"
    # Replacing head_setup_commands drops the defaults' boto3, which the head's autoscaler needs.
    assert any("boto3" in c for c in prepared["head_setup_commands"])


def _drop_worker_resources(cfg):
    del _worker_types(cfg)[next(iter(_worker_types(cfg)))]["resources"]


def _unknown_top_level_key(cfg):
    cfg["idle_timeout_minute"] = cfg.pop("idle_timeout_minutes")


def _unknown_node_type_key(cfg):
    next(iter(_worker_types(cfg).values()))["min_worker"] = 0


def _head_type_missing(cfg):
    cfg["head_node_type"] = "no.such.type"


def _min_over_max(cfg):
    next(iter(_worker_types(cfg).values()))["min_workers"] = cfg["max_workers"] + 1


def _fractional_gpu(cfg):
    next(iter(_worker_types(cfg).values()))["resources"]["GPU"] = 0.5


def _drop_provider(cfg):
    del cfg["provider"]


@pytest.mark.parametrize(
    "mutate, error",
    [
        (_drop_worker_resources, jsonschema.ValidationError),
        (_unknown_top_level_key, jsonschema.ValidationError),
        (_unknown_node_type_key, jsonschema.ValidationError),
        (_fractional_gpu, jsonschema.ValidationError),
        (_head_type_missing, ValueError),
        (_min_over_max, ValueError),
        (_drop_provider, KeyError),
    ],
    ids=lambda p: getattr(p, "__name__", None),
)
def test_ray_rejects_broken_copies(config, offline, mutate, error):
    """The validation above can fail: broken copies of cluster.yaml are refused."""
    broken = copy.deepcopy(config)
    mutate(broken)
    with pytest.raises(error):
        _prepare_and_validate(broken)
