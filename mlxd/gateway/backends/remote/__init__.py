"""Remote backends: OpenAI- or Anthropic-compatible HTTP APIs in front of or behind the local
models (docs/BACKENDS.md).

``remotes`` holds them all; ``upstream`` is one backend's HTTP client (key, timeout, slots,
circuit ``breaker``). A request in the backend's own API is relayed as sent by
``openai_proxy`` or ``anthropic_proxy`` (on the steps of ``proxy``); any other is an event
source (``source``): the backend kind's request built by ``bodies``, its answer read into the
internal event stream by ``readers``, which the request's surface renders. Upstream SSE is
read with ``relay``. Nothing here imports mlx.
"""
