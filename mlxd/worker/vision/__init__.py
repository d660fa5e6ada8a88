"""Vision-language models: images in chat prompts, served on the text models' fast path."""

# The vision tower's features kept by image digest (worker/vision/encoder.py), at most this many
# bytes: a follow-up turn about one image never runs the tower again. The daemon's footprint
# counts it for a vision-language model.
FEATURE_CACHE_BYTES = 64 * 2**20
