"""Scheduling: per-request state and the policy that admits, batches and preempts it."""
