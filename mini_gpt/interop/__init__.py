"""Weights and tokenizers in and out: our checkpoints, transformers models, exports."""
