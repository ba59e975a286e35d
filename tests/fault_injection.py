"""A model whose forward raises on demand: it stands in for a kernel fault (a CUDA error, a C++
kernel's exception), which reaches the engine the same way, from inside `LLMEngine.step`."""

from __future__ import annotations

from engines.llm_engine import LLMEngine

FAULT_TEXT = "injected kernel fault: illegal memory access at 0xdeadbeef"   # must never reach a client


class ForwardFault:
    """Makes `model.forward` raise for the forwards it is armed for, recording the requests of
    each step it failed (read from the engine, as the engine's own handler does)."""

    def __init__(self, model, engine: LLMEngine | None = None):
        self.model, self.engine = model, engine
        self.real = model.forward
        self.skip = 0                 # forwards let through before the armed ones
        self.armed = 0                # forwards that raise
        self.forever = False
        self.failed_steps: list[tuple[str, ...]] = []
        model.forward = self._forward  # an instance attribute shadows the class's forward

    def arm(self, count: int = 1, after: int = 0, forever: bool = False) -> None:
        self.skip, self.armed, self.forever = after, count, forever

    def _forward(self, *args, **kwargs):
        if self.skip:
            self.skip -= 1
        elif self.forever or self.armed:
            self.armed = max(0, self.armed - 1)
            self.failed_steps.append(self.engine.step_request_ids if self.engine else ())
            raise RuntimeError(FAULT_TEXT)
        return self.real(*args, **kwargs)

    def remove(self) -> None:
        del self.model.forward
