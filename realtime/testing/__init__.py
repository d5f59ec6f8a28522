"""Test doubles and server processes for tests, benchmarks and examples."""
