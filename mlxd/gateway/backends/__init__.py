"""Where a model's requests go: the local worker pool or a remote HTTP API (docs/BACKENDS.md).

``router`` maps a model name to its chain of targets (itself, then its fallbacks); ``dispatch``
serves the OpenAI endpoints through that chain; ``upstream`` is one remote API's HTTP client and
``openai_proxy`` relays a request to an OpenAI-compatible one. Like the rest of the gateway,
nothing here imports mlx.
"""
