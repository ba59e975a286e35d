"""The HTTP edge: Starlette app, OpenAI schema and errors, tier clients, CLI."""
