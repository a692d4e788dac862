"""Pieces every benchmark shares: workload configs and stats, the fio reference, scratch files."""
