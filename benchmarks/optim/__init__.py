"""The optimizer-state offload benchmark (issue 18): ``python -m benchmarks.optim.step [--quick]``.

Each system steps in its own process (``worker`` for torch and ours, ``deepspeed_peer`` in
.venv-deepspeed), so peak RSS and cold start are per system; ``io_floor`` runs fio over the
same bytes. ``model`` imports only torch, so the DeepSpeed venv can import it too.
"""
