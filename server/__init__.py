"""server: planned (see the issues); empty for now."""
