"""The fastertransformer model's serving options in config.pbtxt: stream interval (fixed or auto) and the bounded
queue."""

from __future__ import annotations

from pathlib import Path

import pytest
from ftx_triton.errors import ConfigError
from ftx_triton.plan.settings import AUTO, DEFAULT_BATCH_DELAY_US, RepositorySettings
from ftx_triton.repository.model_config import FtModelOptions, build_ft_model_config
from ftx_triton.repository.stream_interval import STREAM_AUTO_RESPONSES, StreamInterval
from tritonclient.grpc import model_config_pb2 as mc


def _options(**choices: object) -> FtModelOptions:
    return FtModelOptions(model_type="GPT-J", io_kind="decoder", checkpoint_path=Path("/x/1-gpu"), tp=1, **choices)  # type: ignore[arg-type]


def test_defaults_write_the_auto_interval_and_no_queue_policy() -> None:
    """A stream's default is ``auto`` with R in its own parameter (editable without a rebuild); a model that does
    not stream gets neither parameter; the queue stays unbounded."""
    config = build_ft_model_config(_options(streaming=True))
    assert config.parameters["ftx_stream_interval"].string_value == "auto"
    assert config.parameters["ftx_stream_auto_responses"].string_value == str(STREAM_AUTO_RESPONSES)
    assert not config.dynamic_batching.HasField("default_queue_policy")
    plain = build_ft_model_config(_options())
    assert not {"ftx_stream_interval", "ftx_stream_auto_responses"} & set(plain.parameters)


def test_stream_interval_is_a_model_parameter() -> None:
    config = build_ft_model_config(_options(streaming=True, stream_interval=4))
    assert config.parameters["ftx_stream_interval"].string_value == "4"
    assert "ftx_stream_auto_responses" not in config.parameters
    every_step = build_ft_model_config(_options(streaming=True, stream_interval=1))  # upstream's behaviour
    assert not {"ftx_stream_interval", "ftx_stream_auto_responses"} & set(every_step.parameters)


@pytest.mark.parametrize(("requests", "interval"), [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3), (32, 8), (33, 9), (64, 16)])
def test_auto_sends_about_r_responses_per_step_for_the_whole_batch(requests: int, interval: int) -> None:
    """interval = ceil(requests / R): one client gets every token, 32 batched requests every 8th."""
    auto = StreamInterval.from_parameters({"ftx_stream_interval": "auto"})
    assert auto.for_batch(requests) == interval
    assert -(-requests // interval) <= STREAM_AUTO_RESPONSES  # responses per step for the batch


@pytest.mark.parametrize(
    ("params", "intervals"),
    [
        ({}, (1, 1, 1)),  # absent: every step, as upstream
        ({"ftx_stream_interval": "1"}, (1, 1, 1)),
        ({"ftx_stream_interval": "3"}, (3, 3, 3)),  # a number stays fixed whatever the batch
        ({"ftx_stream_interval": "auto", "ftx_stream_auto_responses": "2"}, (1, 2, 4)),
        ({"ftx_stream_interval": "auto", "ftx_stream_auto_responses": "0"}, (1, 1, 2)),  # not R: the default
        ({"ftx_stream_interval": "auto", "ftx_stream_auto_responses": "²"}, (1, 1, 2)),
        ({"ftx_stream_interval": "fast"}, (1, 1, 1)),  # as the backend's atoi: not a number, every step
        ({"ftx_stream_interval": "-3"}, (1, 1, 1)),
    ],
)
def test_parameters_read_as_the_backend_patch_reads_them(params: dict[str, str], intervals: tuple[int, ...]) -> None:
    """For 1, 4 and 8 requests in one execution."""
    stream = StreamInterval.from_parameters(params)
    assert tuple(stream.for_batch(n) for n in (1, 4, 8)) == intervals


def test_written_parameters_read_back_the_same() -> None:
    for interval in (AUTO, 1, 2, 7):
        options = _options(streaming=True, stream_interval=interval)
        config = build_ft_model_config(options)
        params = {k: v.string_value for k, v in config.parameters.items()}
        assert StreamInterval.from_parameters(params) == options.stream, interval


def test_the_option_help_names_the_responses_per_step_of_auto() -> None:
    """--stream-interval's help (declared in plan, which cannot import the repository) says R's value."""
    help_text = next(d.help for n, _v, d in RepositorySettings.declarations() if n == "stream_interval")
    assert f"/ {STREAM_AUTO_RESPONSES})" in help_text and f"about {STREAM_AUTO_RESPONSES} responses" in help_text


def test_bounded_queue_rejects_beyond_its_size_and_timeout() -> None:
    config = build_ft_model_config(_options(max_queue_size=32, queue_timeout_ms=1500))
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 32
    assert policy.default_timeout_microseconds == 1_500_000
    assert policy.timeout_action == mc.ModelQueuePolicy.TimeoutAction.REJECT


def test_batch_delay_is_the_batchers_queue_delay() -> None:
    """ftx's default delay with dynamic batching, the given one (0 included) otherwise; without a batcher the
    default is no delay, not a refusal (only a delay given with --no-dynamic-batching is refused, below)."""
    assert DEFAULT_BATCH_DELAY_US > 0
    delay = build_ft_model_config(_options()).dynamic_batching.max_queue_delay_microseconds
    assert delay == DEFAULT_BATCH_DELAY_US
    for given in (0, 2000):
        config = build_ft_model_config(_options(batch_delay_us=given))
        assert config.dynamic_batching.max_queue_delay_microseconds == given
    for given in (None, 0):
        plain = build_ft_model_config(_options(batch_delay_us=given, dynamic_batching=False))
        assert not plain.HasField("dynamic_batching")
    assert _options(dynamic_batching=False).batch_delay == 0


def test_batch_delay_setting_defaults_to_none_and_reads_a_given_zero() -> None:
    """The setting keeps "not given" (None, ftx's default) apart from a given 0 (no delay)."""
    assert RepositorySettings().batch_delay_us is None
    assert RepositorySettings.from_values({"batch_delay_us": 0}).batch_delay_us == 0


@pytest.mark.parametrize(
    ("choices", "needle"),
    [
        ({"stream_interval": 4}, "needs a streaming deployment"),
        ({"streaming": True, "stream_interval": 0}, "at least 1"),
        ({"streaming": True, "stream_interval": -3}, "at least 1"),
        ({"max_queue_size": 4, "dynamic_batching": False}, "--no-dynamic-batching"),
        ({"queue_timeout_ms": -1}, "cannot be negative"),
        ({"batch_delay_us": 500, "dynamic_batching": False}, "--batch-delay-us"),
        ({"batch_delay_us": -1}, "batch delay cannot be negative"),
    ],
)
def test_options_without_what_they_act_on_are_refused(choices: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_ft_model_config(_options(**choices))
