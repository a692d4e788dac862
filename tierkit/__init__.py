"""tierkit: the umbrella package holding the command-line entry point."""

__version__ = "0.1.0"
