"""The prefix cache: the radix index over the pool, whole-cache snapshots, and their disk tiers."""
