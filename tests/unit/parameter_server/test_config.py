"""The parameter service's bounds as settings (parameter_server/config.py, limits.py): every bad value is refused
with a ValueError naming it, from Python, from the command line and in the client."""

from __future__ import annotations

import math

import pytest

from apexrl.common.settings import SettingsError, parse_argv
from apexrl.parameter_server.client import ParameterClient
from apexrl.parameter_server.config import ParamsConfig
from apexrl.parameter_server.limits import PublishLimits

BAD_VALUES = {
    "max_weights_bytes": [0, -1, True, 1.5],
    "max_concurrent_publishes": [0, -3, False, 2.0],
    "publish_idle_timeout": [0, 0.0, -1.0, math.inf, math.nan, True],
}


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, values in BAD_VALUES.items() for v in values])
def test_a_bad_bound_is_a_value_error_naming_it(name, value):
    with pytest.raises(ValueError, match=rf"^{name} \({value!r}\) must be"):
        ParamsConfig(**{name: value})
    with pytest.raises(ValueError, match=rf"^{name} \({value!r}\) must be"):
        PublishLimits(**{name: value})


@pytest.mark.parametrize(
    ("flag", "text", "message"),
    [
        ("--max-weights-bytes", "0", "max_weights_bytes (0) must be a positive number of bytes"),
        ("--max-concurrent-publishes", "-1", "max_concurrent_publishes (-1) must be a positive integer"),
        ("--publish-idle-timeout", "0", "publish_idle_timeout (0.0) must be a finite number of seconds > 0"),
    ],
)
def test_a_bad_bound_on_the_command_line_names_the_flag(flag, text, message):
    with pytest.raises(SettingsError) as info:
        parse_argv(ParamsConfig, [flag, text], "apexrl params")
    assert str(info.value) == f"{flag}: {message}"


def test_the_bounds_reach_the_service_as_publish_limits():
    config = parse_argv(
        ParamsConfig,
        ["--max-weights-bytes", "1024", "--max-concurrent-publishes", "2", "--publish-idle-timeout", "2.5"],
        "apexrl params",
    )
    assert PublishLimits.of(config) == PublishLimits(1024, 2, 2.5)
    assert PublishLimits.of(ParamsConfig()) == PublishLimits() == PublishLimits(1 << 30, 4, 30.0)


@pytest.mark.parametrize("value", [0, -5, True])
def test_the_client_refuses_a_bad_max_weights_bytes(value):
    with pytest.raises(
        ValueError, match=rf"^max_weights_bytes \({value!r}\) must be a positive number of bytes"
    ):
        ParameterClient("127.0.0.1:1", max_weights_bytes=value)
