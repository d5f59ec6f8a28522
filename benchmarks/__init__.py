"""Benchmarks for the ``/v1/realtime`` server: ``python -m benchmarks --help``.

Speed is proven here, with figures printed and written as JSON, never with
timing asserts in the test suite.
"""
