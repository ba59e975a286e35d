"""Llama-family model code: layers, rotary embedding, the decoder, weight mapping."""

from engines.model.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
