"""CLI subcommands; each module exposes `register(app)`."""
