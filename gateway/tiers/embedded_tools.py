"""Tool calls in an embedded tier's answers: parsed out of each choice's text, whole
(`apply_tool_calls`) or as the stream goes (`ToolChunks`), in OpenAI's shapes."""

from __future__ import annotations

from engines.request_output import RequestOutput
from gateway.openai_format import ChoiceResult, ChunkWriter
from gateway.tool_calls import Arguments, CallStart, Content, ToolCallParser, parse_whole
from gateway.tool_plan import ToolPlan


def apply_tool_calls(results: list[ChoiceResult], plan: ToolPlan) -> None:
    """Each choice's calls out of its text; the text left (if any) stays its content."""
    forced = plan.forced is not None
    for result in results:
        content, calls = parse_whole(result.text, plan.parallel, plan.names, forced)
        if calls or forced:
            result.text = content or ""
            result.tool_calls = [c.as_openai() for c in calls]


class ToolChunks:
    """The stream chunks of one choice whose text may hold calls: content as content deltas, each
    call as its index, id and name once, then its argument fragments; an empty final delta with
    the finish reason (tool_calls when it called any)."""

    def __init__(self, writer: ChunkWriter, index: int, plan: ToolPlan):
        self.writer, self.index = writer, index
        self.parser = ToolCallParser(plan.parallel, plan.names, plan.forced is not None)

    def chunks(self, out: RequestOutput, with_logprobs: bool) -> list[bytes]:
        events = self.parser.feed(out.text)
        if out.finished:
            events += self.parser.finish()
        w, i = self.writer, self.index
        chunks, lps = [], out.logprobs if with_logprobs else None
        for event in events:
            if isinstance(event, Content):
                chunks.append(w.delta(i, event.text, lps, None))
                lps = None
            elif isinstance(event, CallStart):
                chunks.append(w.tool_call_start(i, event.index, event.id, event.name))
            elif isinstance(event, Arguments):
                chunks.append(w.tool_call_arguments(i, event.index, event.text))
        if lps:       # this delta's tokens went into a call: their logprobs still go out
            chunks.append(w.delta(i, "", lps, None))
        if out.finished:
            chunks.append(w.finish(i, out.finish_reason, bool(self.parser.calls), out.stop_reason))
        return chunks
