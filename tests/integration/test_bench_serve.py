"""`bench serve` against a scripted OpenAI-compatible server over real HTTP.

The server streams each answer with known delays (first chunk after 60 ms, then one chunk
every 20 ms), counts requests in flight and fails on request, so the report's TTFT, TPOT,
concurrency and error accounting can be checked against what really happened.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from bench.serving.serve import ServeRequest, run_load
from tests.fakes.raw_http import read_request

FIRST_S, GAP_S = 0.060, 0.020


class _Scripted:
    def __init__(self):
        self.in_flight = 0
        self.max_in_flight = 0

    async def chat(self, request):
        body = await request.json()
        if "fail" in body["messages"][0]["content"]:
            return JSONResponse({"error": {"message": "boom", "type": "server_error", "param": None,
                                           "code": None}}, status_code=500)
        n = body["max_tokens"]

        async def stream():
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(FIRST_S)
                for i in range(n):
                    if i:
                        await asyncio.sleep(GAP_S)
                    chunk = {"id": "x", "object": "chat.completion.chunk", "model": body["model"],
                             "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
                yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                self.in_flight -= 1

        # Like the gateway: which tier answered, here chosen by the client's profile hint.
        tier = {"latency": "fast"}.get(request.headers.get("x-tiergate-profile"), "small")
        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-tiergate-tier": tier})

    async def models(self, _):
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})


@pytest.fixture(scope="module")
def scripted_server():
    state = _Scripted()
    app = Starlette(routes=[Route("/v1/chat/completions", state.chat, methods=["POST"]),
                            Route("/v1/models", state.models)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the scripted server did not start"
    yield f"http://127.0.0.1:{port}/v1", state
    server.should_exit = True
    thread.join(timeout=5)


def test_timings_and_concurrency_cap(scripted_server):
    url, state = scripted_server
    requests = [ServeRequest(f"r{i}", f"question {i}", 6) for i in range(12)]
    report = asyncio.run(run_load(url, None, requests, request_rate=float("inf"), concurrency=3,
                                  api_key=None, seed=0, ignore_eos=False, progress=False))
    assert report["model"] == "scripted"          # taken from /v1/models
    assert report["completed"] == 12 and report["failed"] == 0
    assert report["output_tokens"] == 12 * 6 and report["input_tokens"] == 12 * 7
    assert state.max_in_flight == 3               # the cap held and was used
    # Only what the server's sleeps guarantee on any machine under any load: a chunk cannot arrive
    # before it was sent, so every time is at least the scripted one; how much later it comes
    # depends on the load (the arithmetic itself is checked exactly in the test below).
    ttft, e2e = report["ttft_ms"], report["e2e_ms"]
    assert FIRST_S * 1e3 <= ttft["p50"] <= ttft["p99"]
    assert (FIRST_S + 5 * GAP_S) * 1e3 <= e2e["p50"] and ttft["p50"] < e2e["p50"]
    assert e2e["p99"] <= report["elapsed_s"] * 1e3
    assert report["tpot_ms"]["p50"] > 0 and report["itl_ms"]["p99"] >= report["itl_ms"]["p50"] >= 0
    # 4 waves of 3 requests, each at least 60 + 5 * 20 ms
    assert report["elapsed_s"] >= 4 * (FIRST_S + 5 * GAP_S)


def test_summary_arithmetic():
    """TTFT, TPOT (per output token after the first), ITL (chunk gaps) and E2E from known per-request times."""
    from bench.serving.serve import ServeResult, summarize

    results = [ServeResult(True, ttft_s=0.1 * (i + 1), e2e_s=0.1 * (i + 1) + 0.5, chunk_gaps_s=(0.01 * (i + 1),) * 4,
                           prompt_tokens=7, completion_tokens=5) for i in range(4)]
    results.append(ServeResult(False, error="HTTP 500: boom"))
    report = summarize("m", results, elapsed=2.0)
    assert (report["completed"], report["failed"], report["errors"]) == (4, 1, ["HTTP 500: boom"])
    assert report["output_tokens"] == 20 and report["output_tokens_per_s"] == 10.0
    assert report["request_throughput_per_s"] == 2.0
    assert report["ttft_ms"]["p50"] == pytest.approx(250.0)      # 100, 200, 300, 400 ms
    assert report["tpot_ms"]["p50"] == pytest.approx(125.0)      # (e2e - ttft) / (5 - 1): 500 ms / 4
    assert report["e2e_ms"]["p50"] == pytest.approx(750.0)
    assert report["itl_ms"]["p50"] == pytest.approx(25.0)


def test_poisson_arrivals_and_failures(scripted_server):
    url, _ = scripted_server
    requests = [ServeRequest(f"r{i}", "please fail" if i % 5 == 0 else f"q{i}", 2) for i in range(20)]
    report = asyncio.run(run_load(url, "scripted", requests, request_rate=50.0, concurrency=None,
                                  api_key=None, seed=1, ignore_eos=False, progress=False))
    assert report["failed"] == 4 and report["completed"] == 16
    assert report["errors"] and report["errors"][0].startswith("HTTP 500")
    # 20 arrivals at 50/s: the run lasts at least the sum of the exponential gaps slept (seed 1:
    # more than 0.15 s); a lower bound, so it holds however loaded the machine is
    assert report["elapsed_s"] > 0.15


def test_extra_headers_reach_the_server_and_tiers_are_counted(scripted_server):
    url, _ = scripted_server
    requests = [ServeRequest(f"r{i}", f"q{i}", 2) for i in range(5)]
    hinted = asyncio.run(run_load(url, "scripted", requests, request_rate=float("inf"), concurrency=None,
                                  api_key=None, seed=0, ignore_eos=False, progress=False,
                                  extra_headers={"x-tiergate-profile": "latency"}))
    plain = asyncio.run(run_load(url, "scripted", requests, request_rate=float("inf"), concurrency=None,
                                 api_key=None, seed=0, ignore_eos=False, progress=False))
    assert hinted["served_by"] == {"fast": 5} and plain["served_by"] == {"small": 5}


def test_compare_runs_every_level_on_both_servers_in_turn(scripted_server, tmp_path):
    """`--compare`: both servers take the same requests at each level, the first side alternates,
    warm-up requests are not counted, and the ratios are ours over theirs."""
    from bench.bench_reports import serve_report
    from bench.serving.compare import Target, run_levels

    url, state = scripted_server
    requests = [ServeRequest(f"r{i}", f"q{i}", 3) for i in range(6)]
    primary = Target(url, headers={"x-tiergate-profile": "latency"})     # answered as tier "fast"
    levels = asyncio.run(run_levels(primary, Target(url, "scripted"), requests, [1, 3], ignore_eos=False,
                                    seed=0, warmup=2))
    assert [lv["concurrency"] for lv in levels] == [1, 3] and [lv["first"] for lv in levels] == ["server", "compare"]
    for lv in levels:
        assert lv["server"]["served_by"] == {"fast": 6} and lv["compare"]["served_by"] == {"small": 6}
        assert lv["server"]["completed"] == lv["compare"]["completed"] == 6
        ratio = lv["ratio"]["output_tokens_per_s"]
        assert ratio == pytest.approx(lv["server"]["output_tokens_per_s"] / lv["compare"]["output_tokens_per_s"])
    assert state.max_in_flight >= 3
    doc = {"machine": {}, "workload": {}, "server": levels[-1]["server"], "compare": levels[-1]["compare"],
           "levels": levels}
    text = serve_report(doc, tmp_path).read_text()
    assert "By concurrency" in text and (tmp_path / "by_concurrency.png").stat().st_size > 0


def test_concurrency_list_and_compare_usage_errors(tmp_path, capsys):
    from gateway.cli.main import main

    out = str(tmp_path / "s.json")
    assert main(["bench", "serve", "--json", out, "--concurrency", "1,x"]) == 2
    assert "comma list" in capsys.readouterr().err
    assert main(["bench", "serve", "--json", out, "--concurrency", "0,8"]) == 2
    assert main(["bench", "serve", "--json", out, "--compare", "http://127.0.0.1:9/v1"]) == 2
    assert "give --concurrency" in capsys.readouterr().err


def test_compare_header_goes_to_the_compare_server_only(scripted_server, tmp_path):
    """Two tiergate configurations compared need the profile hint on both sides: --header reaches
    the first server only, --compare-header the second."""
    from gateway.cli.main import main

    url, _ = scripted_server
    out = tmp_path / "c.json"
    assert main(["bench", "serve", "--json", str(out), "--base-url", url, "--model", "scripted", "--compare", url,
                 "--compare-model", "scripted", "--concurrency", "1", "--num-requests", "2", "--warmup", "0",
                 "--max-tokens", "3", "--compare-header", "x-tiergate-profile: latency"]) == 0
    level = json.loads(out.read_text())["levels"][0]
    assert level["server"]["served_by"] == {"small": 2} and level["compare"]["served_by"] == {"fast": 2}


def test_a_connection_dropped_before_any_answer_is_sent_again_once():
    """llama.cpp's server may close a kept-alive connection instead of answering: that request
    never reached it, so the client sends it once more; a second drop is a failure."""
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
              b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
              b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
              b"data: [DONE]\n\n")

    async def scenario(drops: int) -> tuple[dict, int]:
        connections = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await read_request(reader)
            if connections <= drops:
                writer.close()             # no status line: the request is dropped unanswered
                return
            writer.write(answer)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            report = await run_load(f"http://127.0.0.1:{port}/v1", "m", [ServeRequest("r0", "q", 1)],
                                    request_rate=float("inf"), concurrency=1, api_key=None, seed=0,
                                    ignore_eos=False, progress=False)
        return report, connections

    once, tried = asyncio.run(scenario(drops=1))
    assert (once["completed"], once["failed"], once["output_tokens"], tried) == (1, 0, 1, 2)
    twice, tried = asyncio.run(scenario(drops=2))
    assert (twice["completed"], twice["failed"], tried) == (0, 1, 2)
    assert twice["errors"][0].startswith("ServerDisconnectedError")
