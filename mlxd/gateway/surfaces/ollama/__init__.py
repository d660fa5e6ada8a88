"""The Ollama API surface: ``/api/chat`` and ``/api/generate`` (``schemas``, ``options``, written
as NDJSON by ``stream`` or whole by ``body``), ``/api/embed`` and ``/api/embeddings``
(``embed``), the model listings (``models``) and Ollama's error shape (``surface``)."""
