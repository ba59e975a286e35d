"""What a request needs of the tier that answers it, in one vocabulary for classification,
routing rules and tier capabilities.

A *capability* is a hard requirement: a tier without it cannot serve the request at all (it is
passed over; with no capable tier left the client gets a 400). The other needs are routing
hints: rules may send code to a coder model or a long prompt to a long-context tier, but any
tier can still answer.
"""

from __future__ import annotations

from typing import Literal, get_args

Capability = Literal["tools", "json_schema", "logprobs"]
CAPABILITIES: frozenset[str] = frozenset(get_args(Capability))

# large_gain: the learned router (policies/gain_model.py) predicts the large tier answers it better.
Need = Literal["code", "non_english", "large_gain", "long_context", "tools", "json_schema", "logprobs"]
NEEDS: tuple[str, ...] = get_args(Need)

# What a tier kind can do when its config does not say: an upstream server is taken to accept
# every OpenAI field (it answers for itself); an embedded engine enforces JSON schemas and tool
# calls by grammar-constrained decoding (engines/grammar/). A tier whose model cannot be trusted
# with them (a tokenizer that cannot spell JSON) declares `capabilities: []`.
DEFAULT_CAPABILITIES: dict[str, frozenset[str]] = {"upstream": CAPABILITIES, "embedded": CAPABILITIES}


def required_capabilities(needs: frozenset[str]) -> frozenset[str]:
    return needs & CAPABILITIES
