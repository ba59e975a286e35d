"""Triton kernels for the GPU path, each with a torch reference of the same signature.

Nothing here imports triton at package import: `triton.jit` decides between compiling and
interpreting when a kernel module is first imported (TRITON_INTERPRET), so callers import
the kernel modules only once `kernels.triton.select.use_triton` said yes.
"""
