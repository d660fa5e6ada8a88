"""Cross-cutting HTTP concerns every API endpoint shares: the access log and request ids
(``accesslog``), API keys and rate limits (``auth``, ``ratelimit``), the body size limit
(``body``) and the request log file (``request_log``)."""
