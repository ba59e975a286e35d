"""Grammar-constrained decoding: a request's structured-output constraint (a JSON schema, any JSON
object, or a Lark grammar), compiled with llguidance off the engine thread and cached by digest,
one matcher per constrained sequence, and one token bitmask per constrained row in the sampler."""

from engines.grammar.compiler import CompiledGrammar, GrammarCompiler
from engines.grammar.errors import GrammarError
from engines.grammar.spec import GrammarSpec
from engines.grammar.state import GrammarState

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "GrammarSpec", "GrammarState"]
