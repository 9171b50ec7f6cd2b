"""The environment contract of the agent (SPEC §8): POLLUX_* over torchrun's variables."""

from __future__ import annotations

import pytest

from pollux.torch.env import AgentEnv, read_env


def test_no_variables_means_one_process() -> None:
    env = read_env({})
    assert env == AgentEnv()
    assert env.source == "single" and not env.distributed and not env.checkpointing
    assert env.rank == 0 and env.num_replicas == 1 and env.num_nodes == 1


def test_pollux_variables_are_read() -> None:
    env = read_env({
        "POLLUX_JOB_ID": "job-7", "POLLUX_RANK": "3", "POLLUX_NUM_REPLICAS": "4",
        "POLLUX_NODE_RANK": "1", "POLLUX_NUM_NODES": "2", "POLLUX_MASTER_ADDR": "10.0.0.5",
        "POLLUX_MASTER_PORT": "4567", "POLLUX_CHECKPOINT_DIR": "/ckpt", "POLLUX_RESTARTS": "2",
        "POLLUX_SCHEDULER_URL": "http://127.0.0.1:8080", "POLLUX_JOB_TOKEN": "secret",
    })
    assert env.source == "pollux"
    assert (env.rank, env.num_replicas, env.node_rank, env.num_nodes) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 4567)
    assert env.checkpoint_dir == "/ckpt" and env.checkpointing
    assert env.restarts == 2 and env.job_id == "job-7"
    assert env.scheduler_url == "http://127.0.0.1:8080" and env.job_token == "secret"
    assert env.init_method == "tcp://10.0.0.5:4567"


def test_torchrun_variables_and_node_count() -> None:
    env = read_env({"RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "host", "MASTER_PORT": "1234",
                    "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert env.source == "torchrun"
    assert (env.rank, env.num_replicas, env.num_nodes, env.node_rank) == (5, 8, 2, 1)
    assert env.local_rank == 1 and env.master_addr == "host" and env.master_port == 1234
    # GROUP_RANK, when torchrun sets it, is the node rank.
    assert read_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                     "GROUP_RANK": "0"}).node_rank == 0
    # Uneven: rounded up.
    assert read_env({"RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}).num_nodes == 2


def test_pollux_takes_precedence_variable_by_variable() -> None:
    env = read_env({
        "RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "torchrun-host", "MASTER_PORT": "1111",
        "LOCAL_WORLD_SIZE": "4",
        "POLLUX_RANK": "2", "POLLUX_NUM_REPLICAS": "3", "POLLUX_MASTER_PORT": "2222",
        "POLLUX_NUM_NODES": "1",
    })
    assert env.source == "pollux"
    assert (env.rank, env.num_replicas, env.num_nodes) == (2, 3, 1)
    assert env.master_port == 2222
    assert env.master_addr == "torchrun-host"      # no POLLUX_MASTER_ADDR: torchrun's is used


def test_empty_values_count_as_unset() -> None:
    env = read_env({"POLLUX_CHECKPOINT_DIR": "  ", "POLLUX_RANK": "", "RANK": "1", "WORLD_SIZE": "2"})
    assert env.checkpoint_dir is None and env.rank == 1 and env.source == "torchrun"


@pytest.mark.parametrize(("environ", "name"), [
    ({"POLLUX_RANK": "x", "POLLUX_NUM_REPLICAS": "2"}, "POLLUX_RANK"),
    ({"POLLUX_RANK": "2", "POLLUX_NUM_REPLICAS": "2"}, "POLLUX_RANK"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK"),
    ({"POLLUX_NUM_REPLICAS": "0"}, "POLLUX_NUM_REPLICAS"),
    ({"POLLUX_NUM_REPLICAS": "2", "POLLUX_NUM_NODES": "3"}, "POLLUX_NUM_NODES"),
    ({"POLLUX_NUM_REPLICAS": "4", "POLLUX_NUM_NODES": "2", "POLLUX_NODE_RANK": "2"}, "POLLUX_NODE_RANK"),
    ({"POLLUX_MASTER_PORT": "70000"}, "POLLUX_MASTER_PORT"),
    ({"POLLUX_RESTARTS": "-1"}, "POLLUX_RESTARTS"),
])
def test_bad_values_name_the_variable(environ: dict[str, str], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        read_env(environ)


def test_ipv6_master_address() -> None:
    assert read_env({"POLLUX_MASTER_ADDR": "::1", "POLLUX_MASTER_PORT": "80"}).init_method == "tcp://[::1]:80"
