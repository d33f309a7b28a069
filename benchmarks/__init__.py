"""The maintained benchmarks, run from the repository root as ``python -m benchmarks.NAME``.

compile_time, sweep_bench, cluster_run, conformance (with the zoo), faults and cache_bench
share ``harness``; ``plots`` draws docs/images from their results in ``benchmarks/results``.
"""
