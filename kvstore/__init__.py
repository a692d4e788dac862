"""kvstore: planned (see the issues); empty for now."""
