"""SSEResponse against an ASGI server whose sends stop completing (a client that stopped reading,
its socket buffers full): the response ends within the write timeout, as if the client had
left, and the chunk iterator is closed so the tier call behind it ends too. And a client that
closes the connection: before [DONE] it left; after [DONE] (the tier's stream not quite ended, as
an upstream's can be) it read the whole answer, and is not counted as gone."""

from __future__ import annotations

import asyncio

import pytest

from gateway.sse import SSEResponse


class _Chunks:
    """An endless stream of chunks that notes when it is closed."""

    def __init__(self):
        self.closed = asyncio.Event()
        self.sent = 0

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        self.sent += 1
        await asyncio.sleep(0)
        return b"data: {}\n\n"

    async def aclose(self) -> None:
        self.closed.set()


async def _never_disconnects():
    await asyncio.Event().wait()


async def test_a_send_that_never_completes_ends_the_response_within_the_write_timeout():
    chunks = _Chunks()
    stuck = asyncio.Event()

    async def send(message):
        if message["type"] == "http.response.body" and chunks.sent >= 3:
            stuck.set()
            await asyncio.Event().wait()        # the client's socket never takes another byte

    response = SSEResponse(chunks, {}, write_timeout_s=0.2)
    await asyncio.wait_for(response({}, _never_disconnects, send), 30)
    assert stuck.is_set() and chunks.closed.is_set()
    assert response.disconnected and response.stalled


async def test_a_slow_tier_between_sends_is_not_a_stalled_client():
    class _Slow(_Chunks):
        async def __anext__(self) -> bytes:
            self.sent += 1
            if self.sent > 3:
                raise StopAsyncIteration
            await asyncio.sleep(0.3)           # longer than the write timeout, but no send is waiting
            return b"data: {}\n\n"

    chunks, sent = _Slow(), []

    async def send(message):
        sent.append(message)

    response = SSEResponse(chunks, {}, write_timeout_s=0.1)
    await asyncio.wait_for(response({}, _never_disconnects, send), 30)
    assert not response.disconnected and not response.stalled
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False} and len(sent) == 5


class _TailAfterDone(_Chunks):
    """Two chunks, [DONE], then a tier stream that has not quite ended (an upstream's last bytes
    still on their way) when the client closes."""

    def __init__(self, events: list[bytes]):
        super().__init__()
        self.events = events

    async def __anext__(self) -> bytes:
        if self.sent < len(self.events):
            self.sent += 1
            return self.events[self.sent - 1]
        await asyncio.Event().wait()        # the tail never comes: the client's close ends it
        raise StopAsyncIteration


async def _leaves_after(count: int, sent: list) -> None:
    while sum(m["type"] == "http.response.body" for m in sent) < count:
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("events, left", [
    ([b"data: {}\n\n", b"data: {}\n\n", b"data: [DONE]\n\n"], False),    # read the whole answer
    ([b"data: {}\n\n", b"data: {}\n\n"], True),                          # left before the end
])
async def test_a_client_that_closes_has_left_only_before_done(events, left):
    chunks, sent = _TailAfterDone(events), []

    async def send(message):
        sent.append(message)

    async def receive():
        await _leaves_after(len(events), sent)
        return {"type": "http.disconnect"}

    response = SSEResponse(chunks, {}, write_timeout_s=5)
    await asyncio.wait_for(response({}, receive, send), 30)
    assert chunks.closed.is_set() and response.disconnected == left
