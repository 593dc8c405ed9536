"""The fastertransformer model's serving options in config.pbtxt: stream interval and the bounded queue."""

from __future__ import annotations

from pathlib import Path

import pytest
from ftx_triton.errors import ConfigError
from ftx_triton.repository.model_config import FtModelOptions, build_ft_model_config
from tritonclient.grpc import model_config_pb2 as mc


def _options(**choices: object) -> FtModelOptions:
    return FtModelOptions(model_type="GPT-J", io_kind="decoder", checkpoint_path=Path("/x/1-gpu"), tp=1, **choices)  # type: ignore[arg-type]


def test_defaults_write_neither_parameter_nor_queue_policy() -> None:
    """Upstream's clients get upstream's behaviour: every step streamed, an unbounded queue."""
    config = build_ft_model_config(_options(streaming=True))
    assert "ftx_stream_interval" not in config.parameters
    assert not config.dynamic_batching.HasField("default_queue_policy")


def test_stream_interval_is_a_model_parameter() -> None:
    config = build_ft_model_config(_options(streaming=True, stream_interval=4))
    assert config.parameters["ftx_stream_interval"].string_value == "4"


def test_bounded_queue_rejects_beyond_its_size_and_timeout() -> None:
    config = build_ft_model_config(_options(max_queue_size=32, queue_timeout_ms=1500))
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 32
    assert policy.default_timeout_microseconds == 1_500_000
    assert policy.timeout_action == mc.ModelQueuePolicy.TimeoutAction.REJECT


def test_batch_delay_is_the_batchers_queue_delay() -> None:
    assert build_ft_model_config(_options()).dynamic_batching.max_queue_delay_microseconds == 0
    config = build_ft_model_config(_options(batch_delay_us=2000))
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000


@pytest.mark.parametrize(
    ("choices", "needle"),
    [
        ({"stream_interval": 4}, "needs a streaming deployment"),
        ({"streaming": True, "stream_interval": 0}, "at least 1"),
        ({"max_queue_size": 4, "dynamic_batching": False}, "--no-dynamic-batching"),
        ({"queue_timeout_ms": -1}, "cannot be negative"),
        ({"batch_delay_us": 500, "dynamic_batching": False}, "--batch-delay-us"),
        ({"batch_delay_us": -1}, "batch delay cannot be negative"),
    ],
)
def test_options_without_what_they_act_on_are_refused(choices: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_ft_model_config(_options(**choices))
