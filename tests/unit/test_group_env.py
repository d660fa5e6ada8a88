"""Which ``mlx.distributed`` backend a worker joins from its launcher's environment
(worker/group.py): ``mlx.launch``'s for ring, NCCL and JACCL, none for a lone worker."""

from __future__ import annotations

import pytest

from mlxd.worker import group

LAUNCH_ENV = ("MLX_HOSTFILE", "MLX_JACCL_COORDINATOR", "MLX_WORLD_SIZE", "NCCL_HOST_IP")


@pytest.mark.parametrize(
    ("env", "backend"),
    [
        ({}, ""),
        ({"MLX_HOSTFILE": "/tmp/hosts.json", "MLX_RANK": "1"}, "ring"),
        ({"MLX_JACCL_COORDINATOR": "10.0.0.1:32323", "MLX_IBV_DEVICES": "/tmp/d"}, "jaccl"),
        ({"MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "10.0.0.1", "NCCL_PORT": "12345"}, "nccl"),
        ({"MLX_WORLD_SIZE": "2"}, ""),
    ],
)
def test_the_launchers_environment_names_the_backend(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], backend: str
) -> None:
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (group._env_backend(), group._launched()) == (backend, backend != "")
