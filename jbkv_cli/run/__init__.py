"""The resumable experiment and its run folder: generate, score, resume."""
