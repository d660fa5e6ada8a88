"""The local backend: this daemon's own worker processes, reached over ZeroMQ.

``backend`` serves an ``ApiRequest`` (opens its choices, ``choices``, or embeds, or counts);
``workers`` is the request client (a DEALER per worker, one reader task routing each
``request_id``'s events to its stream); ``pool`` is the ``WorkerPool`` interface the daemon's
supervisor implements; ``control`` is the control client (status, stats, live knobs);
``replicas`` and ``prefix_router`` spread one model over several workers; ``worker_metrics``
polls them for ``/metrics``.
"""
