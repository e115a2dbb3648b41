"""Node-graph workflows: the JSON format, the compiler to engine requests, and a running graph."""
