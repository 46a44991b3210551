"""Benchmarks: runnable scripts that print ratios against a baseline measured in the same run.

``python -m bench [--quick] [name ...]`` runs every module here that has a ``main(argv)``;
``python -m bench.<module> [--quick]`` runs one.
"""
