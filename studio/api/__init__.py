"""The programmatic doors: gradio_client endpoints and the OpenAI-shaped HTTP routes."""
