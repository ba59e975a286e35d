"""Constraints at the gateway's size bound that chain references or rules end to end: llguidance
recurses once per link, and on a default 8 MiB thread stack such a chain crashed the whole
process. Every compile runs on the compiler's worker with a deep stack, so each of these either
compiles or is refused with a GrammarError. Run in a child process: a crash there fails the test
instead of taking the test run with it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from gateway.response_format import MAX_CONSTRAINT_CHARS, MAX_SCHEMA_CHARS


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _ref_chain(link) -> dict:
    """The longest chain of definitions, each referring to the next, within the schema bound."""
    defs: dict = {}
    i = 0
    while len(_compact({"$defs": defs, "$ref": "#/$defs/0"})) < MAX_SCHEMA_CHARS - 256:
        defs[str(i)] = link(f"#/$defs/{i + 1}")
        i += 1
    defs[str(i)] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/0"}


def _rule_chain(rule: str) -> str:
    lines, i = ["start: r0"], 0
    while sum(len(line) + 1 for line in lines) < MAX_CONSTRAINT_CHARS - 64:
        lines.append(rule.format(i=i, j=i + 1))
        i += 1
    lines.append(f'r{i}: "y"')
    return "\n".join(lines)


CASES = [
    ("json_schema", _compact(_ref_chain(lambda ref: {"properties": {"a": {"$ref": ref}}}))),
    ("json_schema", _compact(_ref_chain(lambda ref: {"items": {"$ref": ref}}))),
    ("json_schema", _compact(_ref_chain(lambda ref: {"anyOf": [{"$ref": ref}, {"type": "null"}]}))),
    ("grammar", _rule_chain('r{i}: "x" r{j}')),
    ("grammar", _rule_chain("r{i}: r{j}")),
]

CHILD = textwrap.dedent("""
    import json, pathlib, sys, tempfile
    from engines.grammar import GrammarCompiler, GrammarError, GrammarSpec
    from engines.tokenizer import TextTokenizer
    from tests.tiny_models import write_tiny_byte_checkpoint

    path = pathlib.Path(tempfile.mkdtemp())
    write_tiny_byte_checkpoint(path)
    tok = TextTokenizer.from_file(path / "tokenizer.json", {})
    compiler = GrammarCompiler(tok, tok.backend.get_vocab_size(), timeout_s=120)
    for kind, text in json.load(sys.stdin):
        try:
            compiler.compile(GrammarSpec(kind, text, "guided_grammar")).new_state()
            print("compiled", flush=True)
        except GrammarError as exc:
            print("refused", str(exc)[:80], flush=True)
    compiler.shutdown()
""")


def test_chains_at_the_size_bound_compile_or_are_refused_without_crashing():
    assert all(len(text) <= MAX_CONSTRAINT_CHARS for _, text in CASES)
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(CASES), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    outcomes = done.stdout.splitlines()
    assert len(outcomes) == len(CASES), outcomes
    assert all(line.startswith(("compiled", "refused")) for line in outcomes), outcomes
