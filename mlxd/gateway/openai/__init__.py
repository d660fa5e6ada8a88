"""The OpenAI surface: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

``endpoints`` serves the requests, ``schemas`` turns their JSON into protocol messages,
``choices`` reads a request's ``n`` worker streams as one, ``collect`` gathers a non-streamed
answer, ``responses`` and ``chunks`` render it (whole, or as SSE chunks framed by ``streaming``),
``logprobs`` and ``tools`` hold the parts both share. This is also the one completion path: the
Anthropic surface (``gateway.anthropic``) parses into the same ``ParsedRequest`` and reads the
same ``Choices``, and the remote backends relay through the same SSE framing.
"""
