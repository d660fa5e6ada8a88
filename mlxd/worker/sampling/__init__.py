"""Tokens in and out: tokenizing prompts, sampling, logprobs, grammars, detokenizing."""
