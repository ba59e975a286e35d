"""The console's one JSON document: tiers, routing, breakers, budgets and the config in force.

Built per poll from what is already in memory, plus the stores where every replica's view
lives: breaker states (and their history) and budget usage are read from Redis when the limits
are there, so any replica's console shows what all replicas see. A store that does not answer
within STORE_TIMEOUT_S leaves its section with an `error` and this replica's own view.

`since` (epoch seconds) trims the sparkline points to those after it: a page that already holds
the series asks for the new points only, which keeps a poll small.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import TYPE_CHECKING

from gateway.console.recorder import ConsoleRecorder
from gateway.telemetry.tier_stats import tier_stats
from policies.budgets.rules import NANO_PER_USD, scope_rules
from policies.budgets.types import NO_LIMIT, Scopes

if TYPE_CHECKING:
    from gateway.reload import ConfigReloader
    from gateway.runtime import Runtime, RuntimeHolder

STORE_TIMEOUT_S = 1.0
DECISIONS = 50
SCOPES_SHOWN = 20           # per kind
_STATES = {"failed": "dead"}


class ConsoleState:
    def __init__(self, holder: RuntimeHolder, recorder: ConsoleRecorder, reloader: ConfigReloader | None = None):
        self.holder = holder
        self.recorder = recorder
        self.reloader = reloader
        self.started_at = time.time()
        self._digest: tuple[int, str] | None = None

    async def document(self, since: float | None = None, decisions: int = DECISIONS) -> dict:
        rt = self.holder.current
        breakers, budgets = await asyncio.gather(self._breakers(rt), self._budgets(rt))
        return {"now": time.time(), "replica": self.recorder.replica, "started_at": self.started_at,
                "tick_s": 1.0, "config": self._config(rt), "tiers": self._tiers(rt, since),
                "routing": self._routing(rt, decisions), "breakers": breakers, "budgets": budgets,
                "console": {"history_error": self.recorder.flush_error, "history_dropped": self.recorder.dropped}}

    # ---- config -------------------------------------------------------------------------
    def _config(self, rt: Runtime) -> dict:
        generation = self.holder.generation
        if self._digest is None or self._digest[0] != generation:
            canonical = rt.config.model_dump_json().encode()
            self._digest = (generation, hashlib.sha256(canonical).hexdigest())
        out = {"digest": self._digest[1], "generation": generation, "path": self.holder.config_path,
               "reloaded_at": None, "file_sha256": None, "rejected": None}
        if self.reloader is not None:
            out.update(reloaded_at=self.reloader.reloaded_at, file_sha256=self.reloader.served_sha256,
                       rejected=self.reloader.rejected)
        return out

    # ---- tiers --------------------------------------------------------------------------
    def _tiers(self, rt: Runtime, since: float | None) -> list[dict]:
        out = []
        for name, tier in rt.tiers.items():
            stats = tier_stats(tier)
            described = tier.describe()
            state = described.get("state", tier.state)
            view = {"name": name, "kind": tier.kind, "state": _STATES.get(state, state), "error": tier.error,
                    "in_flight": tier.in_flight, "max_in_flight": getattr(tier.config, "max_in_flight", None),
                    "dtype": described.get("dtype"), "queue": getattr(stats, "queue_depth", None),
                    "running": getattr(stats, "running", None), "kv_usage": _num(getattr(stats, "kv_usage", None)),
                    "kv_blocks_used": getattr(stats, "kv_blocks_used", None),
                    "kv_blocks_total": getattr(stats, "kv_blocks_total", None),
                    "prefix_hit_rate": _num(getattr(stats, "prefix_hit_rate", None)),
                    "generated_tokens": getattr(stats, "generated_tokens", None),
                    "spec_acceptance": _spec_acceptance(stats)}
            series = self.recorder.series.view(name)
            if since is not None:
                series["points"] = [p for p in series["points"] if p[0] > since]
            view["series"] = series
            out.append(view)
        return out

    # ---- routing ------------------------------------------------------------------------
    def _routing(self, rt: Runtime, decisions: int) -> dict:
        share = {}
        for name in rt.tiers:
            window = self.recorder.series.view(name)["window"]
            share[name] = window["requests"]
        total = sum(share.values())
        log = self.recorder.decisions
        return {"decisions": log.recent(decisions), "decisions_total": log.total,
                "share": {name: {"requests": n, "share": round(n / total, 4) if total else 0.0}
                          for name, n in share.items()}}

    # ---- breakers -----------------------------------------------------------------------
    async def _breakers(self, rt: Runtime) -> dict:
        limits = rt.limits
        if limits is None:
            return {"shared": False, "tiers": {}, "error": None}
        names = list(rt.tiers)
        error = None
        history = self.recorder.history(rt)
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                states = await asyncio.gather(*(limits.breakers.shared_state(n) for n in names))
                events = await history.breaker_events(names)
        except Exception as exc:  # noqa: BLE001 - shown on the page; this replica's view instead
            error = f"breaker store: {exc!r}"
            states = await asyncio.gather(*(limits.breakers.state(n) for n in names))
            events = await self.recorder.memory.breaker_events(names)
        tiers = {}
        for name, st in zip(names, states):
            settings = limits.breakers.settings(name)
            tiers[name] = {"state": st.state, "open_for_s": round(st.open_for_s, 3), "calls": st.calls,
                           "failures": st.failures, "slow": st.slow, "probes_in_flight": st.probes_in_flight,
                           "probe_successes": st.probe_successes, "half_open_probes": settings.half_open_probes,
                           "min_calls": settings.min_calls, "failure_rate": settings.failure_rate,
                           "window_s": settings.window_s, "open_s": settings.open_s, "history": events.get(name, [])}
        return {"shared": limits.shared, "tiers": tiers, "error": error}

    # ---- budgets ------------------------------------------------------------------------
    async def _budgets(self, rt: Runtime) -> dict:
        limits = rt.limits
        if limits is None or not limits.active:
            return {"active": False, "shared": bool(limits and limits.shared), "scopes": [],
                    "refusals": {"counted": [], "others": 0}, "recent_refusals": [], "outages": _outages(limits),
                    "error": None}
        error = None
        history = self.recorder.history(rt)
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                seen = await history.seen(SCOPES_SHOWN)
                refusals, recent = await history.refusals()
                rules = _rules(rt, seen)
                usages = await asyncio.gather(*(limits.budgets.usage(r.scope) for _, _, r in rules))
        except Exception as exc:  # noqa: BLE001 - shown on the page
            error = f"budget store: {exc!r}"
            refusals, recent = await self.recorder.memory.refusals()
            rules, usages = [], []
        scopes = []
        for (kind, label, rule), usage in zip(rules, usages):
            scopes.append({"kind": kind, "id": label, "scope": rule.scope, "in_flight": usage.in_flight,
                           "limits": {"rpm": _lim(rule.rpm), "tpm": _lim(rule.tpm),
                                      "max_concurrent": _lim(rule.max_concurrent),
                                      "tokens_per_day": _lim(rule.tokens_per_day),
                                      "tokens_per_month": _lim(rule.tokens_per_month),
                                      "cost_per_day": _usd(rule.cost_per_day),
                                      "cost_per_month": _usd(rule.cost_per_month)},
                           "used": {"tokens_day": usage.used_tokens_day,
                                    "reserved_tokens_day": usage.reserved_tokens_day,
                                    "tokens_month": usage.used_tokens_month,
                                    "cost_day": usage.used_cost_day / NANO_PER_USD,
                                    "cost_month": usage.used_cost_month / NANO_PER_USD},
                           "refusals": refusals.of_scope(rule.scope)})
        return {"active": True, "shared": limits.shared, "scopes": scopes, "refusals": refusals.as_json(SCOPES_SHOWN),
                "recent_refusals": recent, "outages": _outages(limits), "error": error}


def _rules(rt: Runtime, seen: dict[str, list[str]]) -> list[tuple[str, str, object]]:
    """(kind, label, ScopeRule) of every scope seen that has limits in the config in force."""
    config = rt.config.limits
    out = []
    for kind, ids in seen.items():
        for scope_id in ids:
            if kind == "session":
                tenant, _, session = scope_id.partition("/")
                scopes, prefix = Scopes(tenant=tenant or None, session=session), "s:"
            else:
                scopes, prefix = Scopes(**{kind: scope_id}), "t:" if kind == "tenant" else "k:"
            try:
                rules = [r for r in scope_rules(config, scopes) if r.scope.startswith(prefix)]
            except ValueError:
                continue
            out += [(kind, scope_id, r) for r in rules]
    return out


def _outages(limits) -> list[dict]:
    if limits is None:
        return []
    return limits.budgets.outage_log()


def _lim(value: int) -> int | None:
    return None if value == NO_LIMIT else value


def _usd(nano: int) -> float | None:
    return None if nano == NO_LIMIT else nano / NANO_PER_USD


def _num(value):
    return round(value, 4) if isinstance(value, (int, float)) else None


def _spec_acceptance(stats) -> float | None:
    spec = getattr(stats, "spec", None)
    if not spec:
        return None
    proposed = sum(s.proposed_tokens for s in spec.values())
    accepted = sum(s.accepted_tokens for s in spec.values())
    return round(accepted / proposed, 4) if proposed else None
