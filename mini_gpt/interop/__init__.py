"""Weights and tokenizers in and out: our checkpoints (LoRA merged on load), transformers models, exports."""
