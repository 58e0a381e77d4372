"""``engine.tensor_parallel_size``: the field's values and errors, what vLLM is given, and the pool's TP groups.

No engine and no Ray here; the TP pool on a Ray whose nodes declare GPUs is ``tests/ray/test_gpu_one_node.py`` (and across nodes ``tests/ray/test_gpu_cluster.py``).
"""

from __future__ import annotations

import pytest

from classify.config.sections import EngineConfig, ModelConfig, parse_config
from classify.engine.args import engine_kwargs
from classify.errors import ConfigError
from classify.model.model import ModelRef
from classify.runs.gate import pipeline_differences, pipeline_settings

MODEL = ModelRef(name="m", path="/models/m", fingerprint="sha256:0", source="local")


@pytest.mark.parametrize("value", [1, 2, 4, 8, "auto"])
def test_allowed_sizes(value):
    assert parse_config(EngineConfig, {"tensor_parallel_size": value}).tensor_parallel_size == value


@pytest.mark.parametrize("value", [0, 3, 16, "2", True, 2.0])
def test_other_sizes_are_refused_naming_the_field_and_the_allowed_values(value):
    with pytest.raises(ConfigError, match=r"engine: `tensor_parallel_size` must be 1, 2, 4, 8 or 'auto', got"):
        parse_config(EngineConfig, {"tensor_parallel_size": value}, "engine")


@pytest.mark.parametrize(("device", "tp", "expected"), [
    ("cuda", 2, {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}),
    ("rocm", 8, {"tensor_parallel_size": 8, "distributed_executor_backend": "mp"}),
    ("cuda", 1, {}),
    ("cpu", 4, {}),  # CPU engines run with 1
])
def test_engine_kwargs_carry_the_tp_and_the_mp_executor(device, tp, expected, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kwargs = engine_kwargs(MODEL, ModelConfig(dtype="bfloat16"), EngineConfig(tensor_parallel_size=tp), False, device=device)
    assert {k: kwargs[k] for k in ("tensor_parallel_size", "distributed_executor_backend") if k in kwargs} == expected
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)


def test_tp_is_a_pipeline_setting_the_batch_compares_with_its_pilot():
    from classify.config.batch import RunConfig

    run = RunConfig()
    piloted = pipeline_settings(EngineConfig(tensor_parallel_size=1), run, None)
    assert piloted["engine"]["tensor_parallel_size"] == 1
    assert pipeline_differences(piloted, pipeline_settings(EngineConfig(tensor_parallel_size=2), run, None)) == [
        "engine.tensor_parallel_size: piloted 1, now 2"]


@pytest.mark.parametrize(("nodes", "tp", "groups"), [
    ({"a": 2}, 1, 2), ({"a": 2}, 2, 1), ({"a": 1, "b": 1}, 1, 2), ({"a": 3, "b": 2}, 2, 2), ({"a": 8, "b": 8}, 8, 2),
    ({"cpu-only": 0}, 2, 0),
])
def test_tp_groups_per_node(nodes, tp, groups):
    from batch.pool.placement import tp_groups

    assert tp_groups(nodes, tp) == groups


def test_a_tp_no_node_holds_is_refused_with_the_nodes_gpus():
    from batch.pool.placement import tp_groups

    with pytest.raises(ConfigError, match=r"`engine.tensor_parallel_size` 2 needs 2 GPUs on one node, but the Ray "
                                          r"cluster's nodes have \[1, 1\] GPU\(s\): a tensor-parallel group never spans"):
        tp_groups({"a": 1, "b": 1, "c": 0}, 2)


@pytest.mark.parametrize(("tp", "warned"), [(2, True), (8, True), (1, False), ("auto", False)])
def test_a_cpu_engine_says_it_runs_with_tensor_parallel_1_when_more_was_configured(caplog, tp, warned):
    """docs/cluster.md: "CPU engines always run with 1 (a set value is warned about)": the batch and the server
    both resolve the size through this one function."""
    import logging

    from classify.model.memory import resolve_tensor_parallel

    with caplog.at_level(logging.INFO, logger="classify.model.memory"):
        got = resolve_tensor_parallel(EngineConfig(tensor_parallel_size=tp), ModelConfig(), "cpu", cards_per_node=0)
    assert got == 1
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(lines) == warned, lines
    if warned:
        assert lines == [f"`engine.tensor_parallel_size` is {tp}, but this run computes on the CPU: its engines run "
                         "with tensor parallel 1 (each a whole model copy; `batch.cpu_actors` sets how many)"]
