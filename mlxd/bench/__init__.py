"""Benchmarks: over HTTP against any OpenAI-compatible server, and in-process on the engine."""
