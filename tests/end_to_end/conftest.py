"""End to end: what a user runs, as a user runs it — the CLI commands in subprocesses (train, infer,
reference, compare, uq, jobs), the Python API, bad input (one line, exit status 2, nothing written), the README's
commands, the shipped configs, the examples and plugin families, the benchmarks' scripts.
"""
