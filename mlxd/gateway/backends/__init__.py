"""Who serves a request: ``local/`` (this daemon's worker processes over ZeroMQ) or
``remote/`` (a cloud or another server's HTTP API). Both take the pipeline's ``ApiRequest``."""
