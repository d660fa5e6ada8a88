"""Model runners: the MLX compute of a step, one runner per KV layout."""
