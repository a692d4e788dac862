"""Entry point of one isolated benchmark process (``_isolated.child``).

Kept import-free at module level: worker processes started from the forkserver re-run the main
module, so everything imported here would be imported again in every worker.
"""

if __name__ == "__main__":
    import json
    import sys

    from benchmarks.dataload._isolated import child

    child(json.loads(sys.argv[1]))
