"""The demo: its turn layer and the builder of its small checkpoint."""
