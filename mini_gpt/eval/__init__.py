"""Evaluation: scoring windows and continuations, bits per byte, HellaSwag, the lm-eval harness model."""
