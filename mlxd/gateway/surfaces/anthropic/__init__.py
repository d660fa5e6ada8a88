"""The Anthropic surface: ``/v1/messages`` and ``/v1/messages/count_tokens``.

``schemas`` reads a Messages request into the OpenAI surface's ``ParsedRequest`` (so both APIs
share one path to the worker), ``surface`` names its parser, renderer and error shape, and
``events`` writes the answer as a message body or as Anthropic's named stream events
(``message_start``, ``content_block_delta``, ...).
"""
