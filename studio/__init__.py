"""The studio: a Gradio UI, the gradio_client API and the HTTP API in front of one shared engine.

Never imports torch, diffusers or transformers: it talks to the model only through `engine`.
"""
