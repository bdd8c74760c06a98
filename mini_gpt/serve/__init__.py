"""`mini-gpt serve`: a local playground page and an OpenAI-compatible API over one model.

engine.py holds the model side (a queue, the sampler `mini-gpt generate` uses, the attention view) and
imports no web framework; app.py is the FastAPI application; static/ is the page (plain HTML, JS, CSS).
"""
