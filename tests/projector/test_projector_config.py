"""The projector's section of the configuration: defaults, environment overrides, one line per problem."""

from __future__ import annotations

import pytest

from compensator.config import ConfigError, load


def test_the_projector_section_has_working_defaults_and_checked_overrides() -> None:
    config = load(None, {"COMPENSATOR_PROJECTOR__BATCH_MAX": "200"})
    assert (config.projector.batch_max, config.projector.pg_data) == (200, "var/pg/data")
    with pytest.raises(ConfigError) as raised:
        load(None, {"COMPENSATOR_PROJECTOR__BATCH_MAX": "5000", "COMPENSATOR_PROJECTOR__IDLE_POLL_MS": "1"})
    assert raised.value.problems == [
        "COMPENSATOR_PROJECTOR__BATCH_MAX: projector.batch_max: must be in 1..1000",
        "COMPENSATOR_PROJECTOR__IDLE_POLL_MS: projector.idle_poll_ms: must be in 10..60000",
    ]
