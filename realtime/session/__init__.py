"""One session: the pipeline a dialect's rules are driven through, its lifetime, the
seam a dialect implements (the core rules and capabilities), the work values and the close
codes."""
