"""Checkpoint loaders: GGUF (converted once into a cached HF-layout directory) and HF."""
