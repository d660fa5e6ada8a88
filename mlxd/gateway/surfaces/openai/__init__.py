"""The OpenAI surface: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

``schemas`` validates a body into ``ParsedRequest`` (the internal generation request the
Anthropic surface parses into too), ``surface`` names each endpoint's parser and renderer,
``chunks`` and ``bodies`` write the answer (streamed or whole), ``embeddings`` reads and writes
embeddings, ``logprobs`` and ``tools`` hold the parts both APIs share.
"""
