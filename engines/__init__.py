"""Embedded inference: model, loaders, tokenizer, cache, scheduler, sampler."""
