"""The API surfaces: each reads its JSON into the one internal request and writes the worker's
events back in its own wire format. ``base`` is the contract (``Surface``, ``Renderer``,
``answer``); ``collect`` and ``sse`` are the parts every surface shares; ``openai/`` and
``anthropic/`` are the two APIs."""
