"""Prefix-cache isolation over real HTTP with the official openai client: a tenant reuses its
own cached prompt blocks, another tenant sending the very same prompt gets no hit (so
`cached_tokens` tells it nothing), tenants the operator put in one group or in the shared scope
do share, a request's cache_salt separates end users of one key, and upstream tiers receive a
derived cache_salt only where their config says they support it."""

from __future__ import annotations

import random
import re

import httpx
import openai
import pytest

from policies.config import hash_api_key
from tests.gateway_harness import RunningGateway, shared
from tests.telemetry_harness import RecordingUpstream

KEYS = {tenant: f"sk-prefix-{tenant}-0123456789" for tenant in
        ("alice", "bob", "hank", "carol", "dave", "erin", "frank", "gina")}
# alice and bob say nothing: isolation is the default. hank spells it out, as older files do.
MODES = {"alice": None, "bob": None, "hank": "isolated", "carol": "{group: support}", "dave": "{group: support}",
         "erin": "shared", "frank": "shared", "gina": "{group: billing}"}


def _config(tiny_dir, upstream_url: str) -> str:
    keys = "\n".join(f"    - {{tenant: {t}, sha256: {hash_api_key(k)}}}" for t, k in KEYS.items())
    tenants = "\n".join(f"  {t}: {{prefix_cache: {m}}}" if m else f"  {t}: {{}}" for t, m in MODES.items())
    return f"""
server: {{reload_poll_s: 0}}
auth:
  enabled: true
  keys:
{keys}
tenants:
{tenants}
tiers:
  tiny: {{model: '{tiny_dir}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB, block_size: 16,
          max_num_seqs: 8, max_num_batched_tokens: 256}}
  salted: {{kind: upstream, base_url: "{upstream_url}", model: salted-model, supports_cache_salt: true}}
  plain: {{kind: upstream, base_url: "{upstream_url}", model: plain-model}}
models:
  tiny: {{chain: [tiny]}}
  salted: {{chain: [salted]}}
  plain: {{chain: [plain]}}
"""


class _Gateway:
    def __init__(self, tmp_dir, upstream: RecordingUpstream):
        from tests.tiny_models import write_tiny_checkpoint

        tiny = tmp_dir / "tiny"
        write_tiny_checkpoint(tiny)
        path = tmp_dir / "gateway.yaml"
        path.write_text(_config(tiny, upstream.base_url))
        self.gw = RunningGateway(path, wait_ready=False)
        self.gw.wait_loaded()
        assert self.gw.runtime.tiers["tiny"].ready
        self.base = self.gw.base

    def stop(self) -> None:
        self.gw.stop()


@pytest.fixture(scope="module")
def upstream(request):
    return shared(request, "prefix-recording-upstream", RecordingUpstream)


@pytest.fixture(scope="module")
def gw(request, tmp_path_factory, upstream):
    return shared(request, "prefix-isolation-gateway", lambda: _Gateway(tmp_path_factory.mktemp("prefix"), upstream))


def _client(gw, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.base}/v1", api_key=KEYS[tenant], max_retries=0)


def _prompt(name: str) -> str:
    """A prompt of its own per test (words of the tiny vocabulary; w0-w2 are unk/bos/eos): about
    four full 16-token blocks, none shared with another test's prompt."""
    rng = random.Random(name)
    return " ".join(f"w{rng.randrange(3, 128)}" for _ in range(64))


def _chat_cached(gw, tenant: str, text: str, salt: str | None = None) -> int:
    extra = {"cache_salt": salt} if salt is not None else None
    resp = _client(gw, tenant).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": text}], max_tokens=1, temperature=0, extra_body=extra)
    return resp.usage.prompt_tokens_details.cached_tokens


def _completion_cached(gw, tenant: str, text: str, salt: str | None = None) -> int:
    extra = {"cache_salt": salt} if salt is not None else None
    resp = _client(gw, tenant).completions.create(model="tiny", prompt=text, max_tokens=1, temperature=0,
                                                  extra_body=extra)
    return resp.usage.prompt_tokens_details.cached_tokens


def test_a_tenant_reuses_its_own_cached_prompt(gw):
    text = _prompt("own")
    assert _chat_cached(gw, "alice", text) == 0
    assert _chat_cached(gw, "alice", text) >= 48          # at least three of its four full blocks


def test_another_tenant_gets_no_hit_on_the_same_prompt(gw):
    text = _prompt("cross-tenant")
    _chat_cached(gw, "alice", text)
    assert _chat_cached(gw, "alice", text) > 0            # the prompt is cached ...
    assert _chat_cached(gw, "bob", text) == 0             # ... but not for another tenant (the default)
    assert _chat_cached(gw, "bob", text) > 0              # bob's own copy is cached for bob
    assert _chat_cached(gw, "hank", text) == 0            # nor for one set to `isolated`


def test_completions_are_isolated_too(gw):
    text = _prompt("completions")
    _completion_cached(gw, "bob", text)
    assert _completion_cached(gw, "bob", text) > 0
    assert _completion_cached(gw, "alice", text) == 0


def test_a_declared_group_shares_with_its_members_only(gw):
    text = _prompt("group")
    assert _chat_cached(gw, "carol", text) == 0
    assert _chat_cached(gw, "dave", text) > 0             # same group: carol's blocks serve dave
    assert _chat_cached(gw, "gina", text) == 0            # another group
    assert _chat_cached(gw, "erin", text) == 0            # the shared scope is not a group's
    assert _chat_cached(gw, "alice", text) == 0           # an isolated tenant
    assert _chat_cached(gw, "hank", text) == 0


def test_shared_tenants_share_with_each_other_only(gw):
    text = _prompt("shared")
    assert _chat_cached(gw, "erin", text) == 0
    assert _chat_cached(gw, "frank", text) > 0
    assert _chat_cached(gw, "carol", text) == 0
    assert _chat_cached(gw, "bob", text) == 0


def test_a_request_salt_isolates_end_users_of_one_tenant(gw):
    text = _prompt("salted")
    assert _chat_cached(gw, "alice", text, salt="end-user-1") == 0
    assert _chat_cached(gw, "alice", text, salt="end-user-1") > 0     # the same end user hits
    assert _chat_cached(gw, "alice", text, salt="end-user-2") == 0    # another end user does not
    assert _chat_cached(gw, "alice", text) == 0                       # nor the tenant's unsalted scope
    assert _chat_cached(gw, "bob", text, salt="end-user-1") == 0      # a salt never crosses tenants


def test_a_salt_narrows_a_shared_scope_without_widening_it(gw):
    text = _prompt("salted-group")
    _chat_cached(gw, "carol", text, salt="ticket-7")
    assert _chat_cached(gw, "dave", text, salt="ticket-7") > 0        # same group, same salt
    assert _chat_cached(gw, "dave", text) == 0                        # the group's unsalted scope
    assert _chat_cached(gw, "gina", text, salt="ticket-7") == 0       # same salt, another group


@pytest.mark.parametrize("salt, param", [("", "cache_salt"), ("x" * 257, "cache_salt"), (7, "cache_salt")])
def test_a_bad_cache_salt_is_a_400(gw, salt, param):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "w3"}], "max_tokens": 1, "cache_salt": salt}
    resp = httpx.post(f"{gw.base}/v1/chat/completions", json=body,
                      headers={"authorization": f"Bearer {KEYS['alice']}"}, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param


def _sent(upstream: RecordingUpstream, marker: str) -> list[dict]:
    return [r["body"] for r in upstream.requests if marker in str(r["body"].get("messages") or r["body"].get("prompt"))]


def test_upstream_gets_a_derived_salt_only_where_supported(gw, upstream):
    marker = "upstream-salt-marker"
    msgs = [{"role": "user", "content": marker}]
    for tenant, salt in (("alice", None), ("bob", None), ("alice", "end-user-1"), ("carol", None), ("dave", None)):
        extra = {"cache_salt": salt} if salt is not None else None
        _client(gw, tenant).chat.completions.create(model="salted", messages=msgs, max_tokens=4, extra_body=extra)
    list(_client(gw, "alice").chat.completions.create(model="salted", messages=msgs, max_tokens=4, stream=True,
                                                      extra_body={"cache_salt": "end-user-1"}))
    _client(gw, "alice").completions.create(model="salted", prompt=marker, max_tokens=4)
    _client(gw, "alice").chat.completions.create(model="plain", messages=msgs, max_tokens=4,
                                                 extra_body={"cache_salt": "end-user-1"})
    _client(gw, "bob").completions.create(model="plain", prompt=marker, max_tokens=4)

    salted = [b for b in _sent(upstream, marker) if b["model"] == "salted-model"]
    plain = [b for b in _sent(upstream, marker) if b["model"] == "plain-model"]
    assert len(salted) == 7 and len(plain) == 2
    alice, bob, alice_user, carol, dave, alice_stream, alice_text = (b.get("cache_salt") for b in salted)
    assert all(isinstance(s, str) and re.fullmatch(r"[0-9a-f]{64}", s) for s in (alice, bob, alice_user, carol))
    assert len({alice, bob, alice_user, carol}) == 4      # tenants and end users apart at the upstream too
    assert carol == dave                                 # one declared group, one salt
    assert alice_stream == alice_user and alice_text == alice     # the same scope on every path
    assert "end-user-1" not in alice_user                # the client's own salt never leaves as sent
    assert all("cache_salt" not in b for b in plain)     # a tier without support gets none


def _upstream_cached(gw, tenant: str, model: str, endpoint: str, stream: bool) -> int:
    client, marker = _client(gw, tenant), "upstream-cached-marker"
    if endpoint == "chat":
        kw = dict(model=model, messages=[{"role": "user", "content": marker}], max_tokens=4)
        create = client.chat.completions.create
    else:
        kw, create = dict(model=model, prompt=marker, max_tokens=4), client.completions.create
    if not stream:
        return create(**kw).usage.prompt_tokens_details.cached_tokens
    chunks = list(create(stream=True, stream_options={"include_usage": True}, **kw))
    return chunks[-1].usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_unsalted_upstream_never_tells_an_isolated_tenant_what_was_cached(gw, endpoint, stream):
    """The recording upstream reports 3 cached tokens on every answer. Behind a tier that cannot
    take a cache_salt its one cache serves every tenant, so that count could be another tenant's
    prompt: every tenant sees 0 there, a `shared` one too (the prompt may be an isolated
    tenant's); on a salted tier (isolated at the upstream) the count is shown."""
    for tenant in ("alice", "carol", "erin"):
        assert _upstream_cached(gw, tenant, "plain", endpoint, stream) == 0, tenant
    assert _upstream_cached(gw, "alice", "salted", endpoint, stream) == 3
