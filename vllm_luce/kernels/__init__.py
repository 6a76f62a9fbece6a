"""Triton kernels of vllm-luce.

One folder per op. Each folder holds the Triton kernel with its Python launcher, a `naive.py`
plain-PyTorch reference written for clarity (the ground truth of the tests), and an `__init__.py`
exporting both. Tests live in tests/kernels/ and run on CPU under TRITON_INTERPRET=1 or on a
CUDA device; benchmarks live in benchmarks/kernels/. Shared helpers are in `_triton.py`.
"""
