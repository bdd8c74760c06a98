"""Inference: sampling (generate), left-padded batches, text streaming, devices and dtypes, weight packing."""
