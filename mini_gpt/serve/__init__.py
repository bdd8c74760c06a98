"""`mini-gpt serve`: engine.py the model side, app.py the FastAPI app, static/ the page (HTML, JS, CSS)."""
