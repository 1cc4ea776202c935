"""The tensor-parallel and multi-node flags: what `rill serve` refuses before it starts anything, and
how the cores of a node are shared among its engines and ranks."""
from __future__ import annotations

import argparse

import msgspec
import pytest

from rill.cli import serve_parser
from rill.ipc.config import EngineConfig, ModelConfig, ParallelConfig
from rill.parallel_flags import DEFAULT_MASTER_PORT, check_parallel_flags, engine_configs


def parse(*argv: str):
    parser = serve_parser(argparse.ArgumentParser().add_subparsers())
    args = parser.parse_args(list(argv))
    check_parallel_flags(args, parser)
    return args


@pytest.mark.parametrize("argv, message", [
    (("-tp", "3", "--nnodes", "2"), "split evenly"),
    (("-tp", "2", "--nnodes", "2", "--node-rank", "2", "--headless"), "--node-rank 2"),
    (("--nnodes", "2", "--node-rank", "1", "-tp", "2"), "runs --headless"),
    (("--nnodes", "2", "--headless", "-tp", "2"), "nodes 1 and up"),
    (("-tp", "2", "--data-parallel-size", "2"), "not supported yet"),
    (("-tp", "0",), "at least 1"),
])
def test_impossible_layouts_exit_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_master_port_defaults_to_torchs_over_nodes_and_a_free_one_on_one():
    assert parse("-tp", "2", "--nnodes", "2").master_port == DEFAULT_MASTER_PORT
    assert parse("-tp", "2").master_port == 0  # rank 0 picks a free port
    assert parse("-tp", "2", "--nnodes", "2", "--node-rank", "1", "--headless", "--master-port", "1234").master_port == 1234


def test_each_rank_on_this_node_gets_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    base = EngineConfig(model_id="m", model=ModelConfig(model_dir="m"))
    assert engine_configs(base) == [base]
    (tp4,) = engine_configs(_parallel(base, tensor_parallel_size=4))
    assert tp4.model.num_threads == 2
    (two_nodes,) = engine_configs(_parallel(base, tensor_parallel_size=4, nnodes=2))
    assert two_nodes.model.num_threads == 4  # two ranks here, two on the other node
    assert [c.model.num_threads for c in engine_configs(_parallel(base, data_parallel_size=2))] == [4, 4]


def _parallel(config: EngineConfig, **fields) -> EngineConfig:
    return msgspec.structs.replace(config, parallel=ParallelConfig(**fields))
