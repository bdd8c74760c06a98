"""Evaluation: the tasks (bits per byte, HellaSwag), their scoring, the lm-eval model, reference bands."""
