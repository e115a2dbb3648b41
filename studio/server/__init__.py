"""The web server: the FastAPI app, guards, history tokens, temp files, Gradio internals."""
