"""KV storage: the paged block pool, its formats and views, and the contiguous fallback."""
