"""Executors that turn a BuildSpec into an artifact: source builds and their environments."""
