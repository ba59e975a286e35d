"""An upstream that answers badly, over real HTTP: malformed or oversized answers are the tier's
failures (fallback to the next tier, counted by its breaker), CRLF event streams are read event
by event, and nothing of the upstream's address or of what it sent reaches the client (the
x-tiergate-fallbacks header, 503 bodies, SSE error events); operators find it in the logs. With
no tier left, a timeout is a 504, an overloaded upstream's 429 or 503 a 503 with its Retry-After,
and any other failure a 503 naming its reason code. A stream is relayed only as events a client
can read, and only as a whole answer: a malformed event or a body that ends before [DONE] and
before every choice finished ends it with an error event; its usage is its last report, and
usage that is not a count is ignored rather than failing an answer already sent."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import openai
import pytest

from tests.fakes.upstream import ANSWER
from tests.gateway_harness import InstantUpstream, RunningGateway, logged_request

MSG = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    hostile, good = InstantUpstream(), InstantUpstream()
    path = tmp_path_factory.mktemp("gw-hostile") / "gateway.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  hostile: {{kind: upstream, base_url: "{hostile.base_url}", model: instant, max_response_bytes: 1MiB}}
  up: {{kind: upstream, base_url: "{good.base_url}", model: instant}}
  impatient: {{kind: upstream, base_url: "{hostile.base_url}", model: instant, read_timeout_s: 0.5}}
models:
  h-first: {{chain: [hostile, up]}}
  h-only: {{chain: [hostile]}}
  impatient: {{chain: [impatient]}}
limits:
  breakers: {{default: {{min_calls: 1000}}}}
  retry: {{min_retries_per_window: 1000}}
""")
    gw = RunningGateway(path)
    yield gw, hostile
    gw.stop()
    hostile.stop()
    good.stop()


def _control(upstream: InstantUpstream, **update) -> dict:
    return httpx.post(upstream.base_url.removesuffix("/v1") + "/__control", json=update).json()


@pytest.fixture
def hostile(setup):
    gw, upstream = setup
    yield upstream
    _control(upstream, mode=None, fail_status=None, huge_bytes=4 << 20, delay_s=0)


def _breaker(gw, name: str = "hostile"):
    return asyncio.run_coroutine_threadsafe(gw.runtime.limits.breakers.state(name), gw.server_loop()).result(5)


def _chat(gw, model: str, **body) -> httpx.Response:
    return httpx.post(f"{gw.base}/v1/chat/completions", json={"model": model, "messages": MSG, **body}, timeout=30)


def _stream(gw, model: str, **body) -> tuple[httpx.Response, list[str]]:
    with httpx.stream("POST", f"{gw.base}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": MSG, "stream": True, **body}) as resp:
        lines = [line for line in resp.iter_lines() if line]
    return resp, lines


def _events(lines: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def _text(events: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c.get("choices"))


@pytest.mark.parametrize("mode", ["garbage", "non_object", "bad_usage", "huge"])
def test_a_malformed_answer_falls_back_and_counts_against_the_tier(setup, hostile, mode):
    gw, _ = setup
    _control(hostile, mode=mode, huge_bytes=2 << 20)
    before = _breaker(gw)
    resp = _chat(gw, "h-first")
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == ANSWER
    assert resp.headers["x-tiergate-tier"] == "up"
    assert resp.headers["x-tiergate-fallbacks"] == "hostile: tier_failure"
    after = _breaker(gw)
    assert (after.calls, after.failures) == (before.calls + 1, before.failures + 1)


@pytest.mark.parametrize("mode", ["garbage", "non_object", "huge"])
def test_a_malformed_stream_falls_back_before_any_byte(setup, hostile, mode):
    gw, _ = setup
    _control(hostile, mode=mode, huge_bytes=2 << 20)
    before = _breaker(gw)
    resp, lines = _stream(gw, "h-first")
    assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "up"
    assert resp.headers["x-tiergate-fallbacks"] == "hostile: tier_failure"
    assert _text(_events(lines)) == ANSWER and lines[-1] == "data: [DONE]"
    assert _breaker(gw).failures == before.failures + 1


def test_a_malformed_answer_with_nowhere_to_go_is_a_503_in_openai_form(setup, hostile):
    gw, _ = setup
    _control(hostile, mode="non_object")
    resp = _chat(gw, "h-only")
    assert resp.status_code == 503
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_a_crlf_event_stream_is_relayed_event_by_event_and_its_usage_counted(setup, hostile, caplog):
    gw, _ = setup
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    _control(hostile, mode="crlf")
    resp, lines = _stream(gw, "h-only", stream_options={"include_usage": True})
    events = _events(lines)
    assert resp.headers["x-tiergate-tier"] == "hostile" and _text(events) == ANSWER
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == len(ANSWER.split())
    assert lines[-1] == "data: [DONE]"
    resp, lines = _stream(gw, "h-only")
    assert all(e["choices"] for e in _events(lines))      # the usage chunk the gateway asked for stays here
    line = logged_request(caplog, resp.headers["x-request-id"])
    assert line["completion_tokens"] == len(ANSWER.split())  # ...and was counted


def _leaks(text: str, upstream: InstantUpstream) -> list[str]:
    internal = [upstream.base_url, f"127.0.0.1:{upstream.port}", "failing on purpose",
                "10.9.8.7", "internal detail", "Error:"]
    return [s for s in internal if s in text]


def test_failures_tell_the_client_a_reason_code_and_the_operator_the_detail(setup, hostile, caplog):
    gw, _ = setup
    caplog.set_level(logging.WARNING, logger="gateway.pipeline")
    _control(hostile, fail_status=500)
    served = _chat(gw, "h-first")
    assert served.status_code == 200 and served.headers["x-tiergate-fallbacks"] == "hostile: tier_failure"
    plain = _chat(gw, "h-only")
    streamed, lines = _stream(gw, "h-only")
    for resp, body in ((served, served.text), (plain, plain.text), (streamed, " ".join(lines))):
        text = body + " ".join(f"{k}: {v}" for k, v in resp.headers.items())
        assert not _leaks(text, hostile), text
    assert plain.status_code == streamed.status_code == 503
    assert plain.json()["error"]["code"] == "no_tier_available"
    # This tenant never opted in to content recording: the operator's log line names the tier and
    # the reason code with its HTTP status, not the upstream's bytes (test_failure_detail_privacy.py).
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "gateway.pipeline")
    assert "http_500" in logged and "failing on purpose" not in logged


@pytest.mark.parametrize("mode,code", [("reset", "protocol_error"), ("error_event", "stream_error"),
                                       ("truncated", "truncated_stream"), ("bad_json", "bad_event"),
                                       ("not_utf8", "bad_event"), ("bad_index", "bad_chunk"),
                                       ("bad_tool_calls", "bad_chunk")])
def test_a_stream_that_breaks_after_its_first_event_ends_with_a_safe_error_event(setup, hostile, mode, code):
    gw, _ = setup
    _control(hostile, mode=mode)
    before = _breaker(gw)
    resp, lines = _stream(gw, "h-first")
    assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "hostile"
    events = _events(lines)
    assert events[0]["choices"][0]["delta"]["content"] == ANSWER.split()[0]   # relayed before the break
    error = events[-1]["error"]
    assert error["type"] == "server_error" and code in error["message"]
    assert not _leaks(json.dumps(events) + " ".join(lines), hostile), lines
    assert _breaker(gw).failures == before.failures + 1


def test_an_overloaded_upstream_with_nowhere_to_go_passes_on_its_retry_after(setup, hostile):
    gw, _ = setup
    for status in (503, 429):
        _control(hostile, fail_status=status)
        resp = _chat(gw, "h-only")
        error = resp.json()["error"]
        assert resp.status_code == 503 and error["code"] == "upstream_unavailable", resp.text
        assert f"http_{status}" in error["message"] and resp.headers["retry-after"] == "7"


def test_a_generic_failure_names_its_reason(setup, hostile):
    gw, _ = setup
    _control(hostile, fail_status=500)
    error = _chat(gw, "h-only").json()["error"]
    assert error["code"] == "no_tier_available" and "http_500" in error["message"], error


def test_an_upstream_that_times_out_with_nowhere_to_go_is_a_504(setup, hostile):
    gw, _ = setup
    _control(hostile, delay_s=3)         # past the tier's 0.5 s read timeout
    resp = _chat(gw, "impatient")
    error = resp.json()["error"]
    assert resp.status_code == 504 and error["code"] == "upstream_timeout" and "read_timeout" in error["message"]


def test_a_cut_stream_is_an_error_to_the_openai_client_not_an_answer(setup, hostile):
    gw, _ = setup
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
    for mode in ("truncated", "bad_tool_calls"):
        _control(hostile, mode=mode)
        with pytest.raises(openai.APIError, match="the upstream tier failed"):
            list(client.chat.completions.create(model="h-first", messages=MSG, stream=True))


def test_a_stream_with_every_choice_finished_but_no_done_is_whole(setup, hostile):
    gw, _ = setup
    _control(hostile, mode="no_done")
    before = _breaker(gw)
    resp, lines = _stream(gw, "h-first")
    assert resp.headers["x-tiergate-tier"] == "hostile" and _text(_events(lines)) == ANSWER
    assert lines[-1] == "data: [DONE]" and not any("error" in e for e in _events(lines))
    assert _breaker(gw).failures == before.failures


def test_usage_in_every_chunk_is_counted_once_as_its_last_report(setup, hostile, caplog):
    """The upstream sends the usage so far in every chunk, the last content chunk included, and
    then the closing usage chunk (vLLM's continuous usage stats, not asked for): summed, a
    9-word answer counted 63 completion tokens."""
    gw, _ = setup
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    _control(hostile, mode="running_usage")
    resp, lines = _stream(gw, "h-only", stream_options={"include_usage": True})
    events = _events(lines)
    assert _text(events) == ANSWER and events[-1]["usage"]["completion_tokens"] == len(ANSWER.split())
    line = logged_request(caplog, resp.headers["x-request-id"])
    assert (line["prompt_tokens"], line["completion_tokens"]) == (len(MSG[0]["content"].split()), len(ANSWER.split()))


@pytest.mark.parametrize("mode,counted", [("bad_final_usage", 0), ("bad_usage", len(ANSWER.split()))])
def test_usage_that_is_not_a_count_is_ignored_not_an_error(setup, hostile, caplog, mode, counted):
    """A negative count in the closing usage chunk (or in a usage chunk before the answer, whose
    own closing chunk then counts) leaves the answer whole; without usage the stream is charged
    as any stream without usage is."""
    gw, _ = setup
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    _control(hostile, mode=mode)
    before = _breaker(gw)
    resp, lines = _stream(gw, "h-first", stream_options={"include_usage": True})
    events = _events(lines)
    assert resp.headers["x-tiergate-tier"] == "hostile" and "x-tiergate-fallbacks" not in resp.headers
    assert _text(events) == ANSWER and lines[-1] == "data: [DONE]"
    usages = [e["usage"] for e in events if e.get("usage")]
    assert all(u["prompt_tokens"] >= 0 and u["completion_tokens"] >= 0 for u in usages)   # not relayed
    assert _breaker(gw).failures == before.failures
    line = logged_request(caplog, resp.headers["x-request-id"])
    assert line["completion_tokens"] == counted and line["error"] is None


def test_a_redirect_is_a_tier_failure_whatever_its_body(setup, hostile):
    gw, _ = setup
    _control(hostile, mode="redirect_json")
    before = _breaker(gw)
    plain = _chat(gw, "h-first")
    streamed, lines = _stream(gw, "h-first")
    for resp in (plain, streamed):
        assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "up"
        assert resp.headers["x-tiergate-fallbacks"] == "hostile: tier_failure"
    assert _text(_events(lines)) == ANSWER
    assert _breaker(gw).failures == before.failures + 2
