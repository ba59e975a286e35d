"""A constraint the engine cannot compile (invalid or unsupported schema, too complex, too slow)."""

from __future__ import annotations

from engines.sampling_params import InvalidRequestError


class GrammarError(InvalidRequestError):
    """The request's constraint is wrong or beyond the engine's limits: the client's fault. `param`
    names the request field it came from (response_format, tools, tool_choice)."""
