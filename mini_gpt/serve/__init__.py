"""`mini-gpt serve`: a local playground page and an OpenAI-compatible API over one model (engine.py: the
model side, no web framework; app.py: the FastAPI application; static/: the page, plain HTML, JS, CSS)."""
