"""Triton kernels, their torch reference ops, and the dispatch between them."""
