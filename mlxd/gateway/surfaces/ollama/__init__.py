"""The Ollama API surface: ``/api/chat`` and ``/api/generate`` (``schemas``, ``options``, written
as NDJSON by ``stream`` or whole by ``body``, durations from ``timing``), ``/api/embed`` and
``/api/embeddings`` (``embed``), their endpoints on the pipeline with Ollama's model names and
load/unload bodies (``endpoints``, ``names``), the model listings (``models``) and Ollama's
error shape (``surface``)."""
