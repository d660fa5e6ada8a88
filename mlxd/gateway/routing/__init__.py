"""Where a request may go: ``router`` maps a model name (or alias) to its chain of targets,
itself and then its fallbacks, local or remote. The pipeline walks the chain."""
