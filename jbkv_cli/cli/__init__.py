"""The command line: Typer wiring, the entry point, the commands and output checks."""
