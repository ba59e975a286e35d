"""What a client gets when an upstream's failure is the chain's last word: a timeout is a 504, an
overloaded upstream's 429 or 503 a 503 passing on its Retry-After when that is plain seconds
(capped at an hour; anything else the upstream sends there is its bytes, and is dropped), any
other failure the gateway's generic 503."""

from __future__ import annotations

import pytest

from gateway.tiers.upstream_errors import MAX_PASSED_RETRY_AFTER_S, client_error_for


@pytest.mark.parametrize("code", ["read_timeout", "write_timeout", "timeout", "http_504"])
def test_a_timeout_is_a_504(code):
    error = client_error_for(code)
    assert error.status == 504 and error.code == "upstream_timeout" and code in error.message


@pytest.mark.parametrize("sent, passed", [("7", "7"), (" 12 ", "12"), ("99999", str(MAX_PASSED_RETRY_AFTER_S)),
                                          (None, None), ("", None), ("²", None), ("1" * 5000, None),
                                          ("-3", None), ("1.5", None), ("Wed, 21 Oct 2026 07:28:00 GMT", None)])
@pytest.mark.parametrize("code", ["http_429", "http_503"])
def test_an_overloaded_upstream_passes_on_plain_seconds_only(code, sent, passed):
    error = client_error_for(code, sent)
    assert error.status == 503 and error.code == "upstream_unavailable"
    assert (error.headers or {}).get("retry-after") == passed


@pytest.mark.parametrize("code", ["connect_error", "connect_timeout", "http_500", "invalid_json"])
def test_anything_else_is_left_to_the_generic_503(code):
    assert client_error_for(code) is None
