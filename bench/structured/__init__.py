"""`tiergate bench structured`: grammar-constrained decoding against plain decoding on the same
prompts in one run, and grammar compile times."""
