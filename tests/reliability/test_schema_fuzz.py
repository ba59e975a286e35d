"""Schema-driven fuzzing of the completion endpoints: schemathesis reads the gateway's own
/openapi.json over real HTTP and sends the bodies it generates from it (positive mode: what the
document says is valid) to a gateway with one small embedded tier on the tiny random Llama.

Every answer must be below 500; every non-2xx must be exactly OpenAI's error object; every 200
must be a completion object (or an SSE stream ending in [DONE]). Because the document states what
the validators enforce (the served model names as an enum, the numeric bounds), generated chat
requests must mostly reach the tier: at least 80 % of them answered 200 (of those that do not
carry tools or ask for JSON, which this tier does not offer: its tiny word-level vocabulary cannot
spell JSON, so it declares no capabilities; 400 unsupported_capability by design).

The run is derandomized (the same cases on every machine) and nothing in it depends on timing.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from policies.config import hash_api_key
from tests.gateway_harness import RunningGateway, shared

MAX_EXAMPLES = 150
# Generated output limits go up to the schema's 2**20, and a body without one runs to the end of the
# context; the fuzzer checks the edge, not the engine's speed, so each answer is kept short.
MAX_OUTPUT = 4

KEY = "sk-fuzz-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
CONFIG = """
server: {{reload_poll_s: 0}}
auth:
  enabled: true
  keys:
    - {{tenant: fuzz, sha256: {digest}}}
tenants:
  fuzz: {{}}
tiers:
  tiny: {{model: '{tiny_dir}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB, block_size: 16,
          max_num_seqs: 8, max_num_batched_tokens: 256, capabilities: []}}
models:
  tiny: {{chain: [tiny]}}
"""

ERROR_FIELDS = {"message", "type", "param", "code"}
UNSUPPORTED = "400 unsupported_capability"      # counted apart from the other statuses
UNDEFINED_TOOL = "400 tool_choice names no defined tool"


class _Gateway:
    def __init__(self, tmp_dir):
        from tests.tiny_models import write_tiny_checkpoint

        tiny = tmp_dir / "tiny"
        write_tiny_checkpoint(tiny)
        path = tmp_dir / "gateway.yaml"
        path.write_text(CONFIG.format(tiny_dir=tiny, digest=hash_api_key(KEY)))
        self.gw = RunningGateway(path, wait_ready=False)
        self.gw.wait_loaded()
        assert self.gw.runtime.tiers["tiny"].ready
        self.base = self.gw.base

    def stop(self) -> None:
        self.gw.stop()


@pytest.fixture(scope="module")
def gw(request, tmp_path_factory):
    return shared(request, "schema-fuzz-gateway", lambda: _Gateway(tmp_path_factory.mktemp("fuzz")))


@pytest.fixture(scope="module")
def schema(gw):
    return schemathesis.openapi.from_url(f"{gw.base}/openapi.json", headers=AUTH)   # its model ids, as the key's


def _short(body):
    """The generated body with its output limits capped (and one set where it has none)."""
    if isinstance(body, dict):
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = MAX_OUTPUT
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), (int, float)) and not isinstance(body[key], bool) and body[key] > MAX_OUTPUT:
                body[key] = MAX_OUTPUT
    return body


def _check_error(response) -> None:
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == ERROR_FIELDS, body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"], body
    assert error["param"] is None or isinstance(error["param"], str), body
    assert error["code"] is None or isinstance(error["code"], str), body


def _check_answer(response, body: dict, obj: str) -> None:
    chat = obj == "chat.completion"
    choices = int(body.get("n") or 1) * (1 if chat else len(_prompts(body)))   # null is the default, 1
    if body.get("stream"):
        assert response.headers["content-type"].startswith("text/event-stream"), response.headers
        data = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
        assert data and data[-1] == "[DONE]", response.text[-500:]
        chunks = [json.loads(d) for d in data[:-1]]
        assert chunks and all(c["object"] == (obj + ".chunk" if chat else obj) for c in chunks), chunks
        finished = {c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")}
        assert finished == set(range(choices)), chunks
        return
    answer = response.json()
    assert answer["object"] == obj, answer
    assert sorted(c["index"] for c in answer["choices"]) == list(range(choices)), answer
    for choice in answer["choices"]:
        text = choice["message"]["content"] if chat else choice["text"]
        assert isinstance(text, str) and choice["finish_reason"] in ("stop", "length"), answer
    assert isinstance(answer["usage"]["completion_tokens"], int), answer


def _prompts(body: dict) -> list:
    prompt = body["prompt"]
    if isinstance(prompt, str) or (prompt and not any(isinstance(x, (str, list)) for x in prompt)):
        return [prompt]
    return prompt


def _fuzz(schema, base: str, path: str, obj: str) -> Counter:
    operation = schema[path]["POST"]
    statuses: Counter = Counter()

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])
    @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
    def run(case):
        case.body = _short(case.body)
        # Sent with requests itself, not case.call: schemathesis stops reading an event stream after
        # 20 events (or on a clock), and a whole stream is what is checked here.
        response = requests.request(**case.as_transport_kwargs(base_url=base, headers=AUTH), timeout=120)
        error = response.json().get("error") if response.status_code == 400 else None
        if error is not None and error["code"] == "unsupported_capability":
            statuses[UNSUPPORTED] += 1
        elif error is not None and error["param"] == "tool_choice":
            statuses[UNDEFINED_TOOL] += 1
        else:
            statuses[response.status_code] += 1
        where = f"{case.as_curl_command()}\n-> {response.status_code} {response.text[:500]}"
        assert response.status_code < 500, where
        if 200 <= response.status_code < 300:
            _check_answer(response, case.body, obj)
        else:
            _check_error(response)

    run()
    return statuses


def test_chat_completions_fuzz(gw, schema):
    statuses = _fuzz(schema, gw.base, "/v1/chat/completions", "chat.completion")
    total = sum(statuses.values())
    print(f"chat: {total} cases, statuses {dict(statuses)}")
    assert total >= MAX_EXAMPLES // 2, statuses
    # A valid request with tools cannot reach this gateway's one embedded tier by design (it
    # lacks the capability: 400 unsupported_capability), and one whose tool_choice names a
    # function its tools do not define is refused (the document cannot say the name must be
    # among the tools); of the others, most must be answered.
    assert statuses[200] >= 0.8 * (total - statuses[UNSUPPORTED] - statuses[UNDEFINED_TOOL]), statuses


def test_completions_fuzz(gw, schema):
    statuses = _fuzz(schema, gw.base, "/v1/completions", "text_completion")
    total = sum(statuses.values())
    print(f"completions: {total} cases, statuses {dict(statuses)}")
    # No 80 % here: much of what the document admits is refused by the embedded tier itself (echo,
    # suffix, best_of other than n, token ids past its vocabulary), rightly and in OpenAI's form.
    assert total >= MAX_EXAMPLES // 2 and statuses[200] > 0, statuses


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_tokenizer_endpoints_fuzz(gw, schema, path):
    operation = schema[path]["POST"]
    statuses: Counter = Counter()

    @settings(max_examples=MAX_EXAMPLES // 3, derandomize=True, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])
    @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
    def run(case):
        response = requests.request(**case.as_transport_kwargs(base_url=gw.base, headers=AUTH), timeout=60)
        statuses[response.status_code] += 1
        assert response.status_code < 500, f"{case.as_curl_command()}\n-> {response.status_code} {response.text[:500]}"
        if response.status_code == 200:
            answer = response.json()
            assert (answer["count"] == len(answer["tokens"])) if path == "/tokenize" else isinstance(answer["prompt"], str)
        else:
            _check_error(response)

    run()
    assert statuses[200] > 0, statuses
    stranger = requests.post(f"{gw.base}{path}", json={"model": "tiny", "prompt": "a", "tokens": [1]}, timeout=60)
    assert stranger.status_code == 401
    _check_error(stranger)
