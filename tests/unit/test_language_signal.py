"""The language detector (policies/language_signal.py): other scripts and Latin-script prose with
almost no common English words fire; English, however short or technical, does not; the work
is bounded by the window; the need reaches classification and routing."""

from __future__ import annotations

import pytest

from policies.classify import Classifier, RequestFeatures
from policies.config import parse_config
from policies.language_signal import WINDOW_CHARS, language_signal
from policies.route import Router


@pytest.mark.parametrize("text,why", [
    ("Kako se kaže emajlirano na engleskom?", "words: 0 of 6"),
    ("coneccion entre harina de garbanzo y alergias alimentarias", "words: 0 of 8"),
    ("Wie funktioniert ein Verbrennungsmotor genau?", "words:"),
    ("请帮我写一封求职信", "script:"),
    ("Расскажи мне о истории Москвы", "script:"),
    ("東京の天気はどうですか", "script:"),
])
def test_fires_on_other_languages(text, why):
    assert why in (language_signal(text) or "")


@pytest.mark.parametrize("text", [
    "What is the capital of France?",
    "Write a javascript for Google Tag Manager that sends an event",
    "Translate that to brazilian portuguese and convert to metric",
    "tell me 3 jokes",
    "Hi",                                        # too short to tell
    "explain ELK mappings",                      # three words, one of them common
    "café au lait is my favourite drink in the morning",
    "",
])
def test_stays_quiet_on_english(text):
    assert language_signal(text) is None


def test_only_the_window_is_read():
    assert language_signal("What is the answer to this? " * 200 + "请帮我写一封求职信" * 100) is None
    assert language_signal("请帮我写一封求职信" * (WINDOW_CHARS // 9 + 1) + " and the rest is English") is not None


CONFIG = """
auth: {enabled: false}
tiers: {small: {}, large: {}}
models: {auto: {chain: [small, large]}}
routing:
  rules:
    - {name: non-english, match: {needs: [non_english]}, chain: [large, small]}
"""


def test_the_need_is_classified_and_routed():
    cfg = parse_config(CONFIG)
    router = Router(cfg.models, cfg.routing.rules)
    assert router.needs_language_signal and not router.needs_code_signal
    features = RequestFeatures("chat", "auto", "t", "interactive", False,
                               language=language_signal("Kako se kaže emajlirano na engleskom?"))
    verdict = Classifier(cfg.classification).classify(features)
    assert verdict.needs == frozenset({"non_english"})
    assert "needs non_english (words: 0 of 6 common in English)" in verdict.reasons
    decision = router.route("t", "interactive", "auto", verdict.profile, verdict.needs)
    assert decision.chain == ("large", "small") and decision.reason == "route non-english: needs non_english"
