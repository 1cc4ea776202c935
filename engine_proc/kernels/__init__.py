"""Rill's CPU kernels: the C++ extension (extension.py), the linear kinds and the fused elementwise ops."""
