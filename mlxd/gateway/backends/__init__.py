"""Where a model's requests go: the local worker pool or a remote HTTP API (docs/BACKENDS.md).

``router`` maps a model name to its chain of targets (itself, then its fallbacks); ``dispatch``
serves the OpenAI endpoints through that chain; ``upstream`` is one remote API's HTTP client;
``openai_proxy`` and ``anthropic_proxy`` serve a client of each API from a backend of either
kind (translating where they differ) on the steps of ``proxy``, relaying streams with ``relay``.
Like the rest of the gateway, nothing here imports mlx.
"""
