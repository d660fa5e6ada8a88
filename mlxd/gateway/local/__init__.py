"""The local backend: this daemon's own worker processes, reached over ZeroMQ.

``workers`` is the request client (a DEALER per worker, one reader task routing each
``request_id``'s events to its stream); ``pool`` is the ``WorkerPool`` interface the daemon's
supervisor implements; ``control`` is the control client (status, stats, live knobs; it shares
its socket code, ``protocol.client_channel``, with the request client); ``replicas`` and
``prefix_router`` spread one model over several workers; ``worker_metrics`` polls them for
``/metrics``. It is a package of its own rather than part of ``gateway.backends`` because the
rest of the gateway (the API surfaces, admin, health, metrics) talks to it directly, while
``backends`` holds the routing chain and the remote HTTP APIs that sit in front of it.
"""
