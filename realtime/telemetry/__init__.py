"""What the server reports and keeps: Prometheus metrics, session logs, recordings."""
