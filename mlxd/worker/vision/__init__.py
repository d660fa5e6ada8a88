"""Vision-language models: images in chat prompts, served on the text models' fast path."""
