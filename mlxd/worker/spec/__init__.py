"""Speculative decoding: drafting policy, drafters, and verification of drafts."""
