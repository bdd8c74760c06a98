"""Inference: sampling (generate), text streaming, devices and dtypes, CPU weight packing."""
