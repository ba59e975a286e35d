"""Answers with the usage a server running a real model reports: its chat template rendered and
tokenized (special-token strings parsed as special tokens, as vLLM does) for the prompt, and the
answer's own tokens, cut at max_tokens, for the completion. For tests of budgets that must hold
against what an upstream really counts (the instant upstream counts words)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tokenizers import Tokenizer

from bench.serving.instant_upstream import ANSWER
from engines.chat_template import ChatTemplate
from engines.tokenizer import TextTokenizer


class RealUsage:
    def __init__(self, checkpoint_dir: str | Path):
        ckpt = Path(checkpoint_dir)
        config = json.loads((ckpt / "tokenizer_config.json").read_text())
        self.tokenizer = TextTokenizer(Tokenizer.from_file(str(ckpt / "tokenizer.json")), config)
        self.template = ChatTemplate(config.get("chat_template"), self.tokenizer.bos_token, self.tokenizer.eos_token)
        self.answer_ids = self.tokenizer.encode(ANSWER, add_special_tokens=False)

    def prompt_tokens(self, body: dict, chat: bool) -> int:
        if chat:
            messages = [{"role": m.get("role"), "content": _text(m.get("content"))} for m in body["messages"]]
            return len(self.tokenizer.encode(self.template.render(messages)))
        prompt = body.get("prompt", "")
        prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else prompt
        return sum(len(p) if isinstance(p, list) else len(self.tokenizer.encode(p)) for p in prompts)

    def answer(self, body: dict, chat: bool) -> dict:
        """A whole answer: n choices of ANSWER, each cut at max_tokens, with the real usage."""
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or len(self.answer_ids)
        ids = self.answer_ids[:limit]
        text = self.tokenizer.decode(ids)
        n = int(body.get("n") or 1)
        reason = "length" if len(ids) < len(self.answer_ids) else "stop"
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                        "finish_reason": reason} for i in range(n)]
        else:
            choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": reason} for i in range(n)]
        prompt = self.prompt_tokens(body, chat)
        usage = {"prompt_tokens": prompt, "completion_tokens": len(ids) * n, "total_tokens": prompt + len(ids) * n}
        return {"id": "cmpl-real", "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": body.get("model", "real"), "choices": choices, "usage": usage}


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)
