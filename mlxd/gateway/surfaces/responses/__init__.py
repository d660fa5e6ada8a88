"""The OpenAI Responses surface: ``/v1/responses`` and the stored responses' routes.

``schemas`` reads a Responses body (``items`` its input, ``tools`` its tools) into the chat
request every backend serves, ``events`` and ``body`` write the answer as typed stream events or
a ``response`` object, ``store`` keeps finished responses for ``previous_response_id``, and
``surface`` names the parser, the renderer and the routes.
"""
