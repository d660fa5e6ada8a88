"""Remote backends: OpenAI- or Anthropic-compatible HTTP APIs in front of or behind the local
models (docs/BACKENDS.md).

``remotes`` holds them all; ``upstream`` is one backend's HTTP client (key, timeout, slots,
circuit ``breaker``); ``openai_proxy`` and ``anthropic_proxy`` relay a client of each API to a
backend of either kind on the steps of ``proxy`` (translating with ``openai_to_anthropic`` and
``anthropic_to_openai`` where they differ), reading upstream SSE with ``relay``. Nothing here
imports mlx.
"""
