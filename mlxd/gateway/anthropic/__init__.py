"""The Anthropic surface: ``/v1/messages`` and ``/v1/messages/count_tokens``.

``schemas`` reads a Messages request into the OpenAI surface's ``ParsedRequest`` (so both APIs
share one completion path to the worker), ``endpoints`` serves it, and ``events`` renders the
answer as a message body or as Anthropic's named stream events (``message_start``,
``content_block_delta``, ...).
"""
