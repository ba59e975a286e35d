"""`bench serve` refuses, before any request is sent, a URL that is not one, a server that does not
accept connections and a --max-prompt-tokens no prompt fits; its JSON never holds NaN."""

from __future__ import annotations

import asyncio
import http.server
import json
import math
import socket
import threading

import pytest

from bench.common import write_json
from bench.serving.serve import ServeRequest, load_serve_requests, run_load
from gateway.cli.main import main
from gateway.cli.usage_error import UsageError


def _one_line(capsys, argv: list[str], text: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err and "Traceback" not in err, err


@pytest.mark.parametrize("url", ["notaurl", "ftp://127.0.0.1/v1", "http://:80/v1", "http://127.0.0.1:99999/v1"])
def test_not_a_url(tmp_path, capsys, url):
    _one_line(capsys, ["bench", "serve", "--json", str(tmp_path / "s.json"), "--base-url", url], "--base-url")
    assert not (tmp_path / "s.json").exists()


def test_unreachable_server(tmp_path, capsys):
    with socket.socket() as probe:      # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _one_line(capsys, ["bench", "serve", "--json", str(tmp_path / "s.json"), "--base-url",
                       f"http://127.0.0.1:{port}/v1"], "cannot connect")
    assert not (tmp_path / "s.json").exists()


def test_unreachable_compare_server(tmp_path, capsys):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        _one_line(capsys, ["bench", "serve", "--json", str(tmp_path / "s.json"), "--concurrency", "1",
                           "--base-url", f"http://127.0.0.1:{listening.getsockname()[1]}/v1",
                           "--compare", "http://127.0.0.1:1/v1"], "--compare")


@pytest.mark.parametrize("max_prompt_tokens", [1, 16])
def test_no_prompt_fits(max_prompt_tokens):
    with pytest.raises(UsageError, match=f"no prompt of the workload fits --max-prompt-tokens {max_prompt_tokens}"):
        load_serve_requests(4, max_prompt_tokens, 8, 0)


def test_write_json_writes_null_for_non_finite(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"p": {"p50": math.nan, "p99": math.inf}, "xs": [1.5, -math.inf], "t": (math.nan,), "n": 3})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"p": {"p50": None, "p99": None}, "xs": [1.5, None], "t": [None], "n": 3}


def test_server_that_lists_no_model():
    """Without --model the name comes from /v1/models: a server without that route is one line."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        with pytest.raises(UsageError, match="give --model"):
            asyncio.run(run_load(url, None, [ServeRequest("r", "q", 2)], request_rate=float("inf"), concurrency=1,
                                 api_key=None, seed=0, ignore_eos=False, progress=False))
    finally:
        server.shutdown()
        server.server_close()
