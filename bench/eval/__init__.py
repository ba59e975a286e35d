"""Quality evaluations (held-out perplexity and agreement) that write JSON."""
