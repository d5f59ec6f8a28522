"""``python -m benchmarks``: run the benchmark rows and print the table."""

from __future__ import annotations

from benchmarks.main import main

raise SystemExit(main())
