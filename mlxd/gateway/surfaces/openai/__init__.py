"""The OpenAI surface: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

``schemas`` validates a body into ``ParsedRequest`` (``gateway/request.py``'s internal generation
request, which the Anthropic surface parses into too), ``surface`` names each endpoint's parser
and renderer, ``chunks`` and ``bodies`` write the answer (streamed or whole), ``embeddings`` reads
and writes embeddings, ``logprobs`` writes log probabilities. Tools (definitions in requests,
calls in output) are shared by both APIs: ``gateway/tools/``.
"""
