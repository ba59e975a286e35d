"""Config file text for tests of what the loader accepts and refuses."""

from __future__ import annotations

import pytest

from policies.config import ConfigError, parse_config

UP = "{kind: upstream, base_url: 'http://127.0.0.1:9/v1', model: m}"
AUTH_OFF = "auth: {enabled: false}\n"


def config_error(text: str) -> str:
    """The one-line error that loading `text` (as gw.yaml) gives."""
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "gw.yaml")
    message = str(caught.value)
    assert "\n" not in message
    return message
