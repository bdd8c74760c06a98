"""Evaluation: the tasks (tasks.py: bits per byte, HellaSwag), their scoring, the lm-eval harness model."""
