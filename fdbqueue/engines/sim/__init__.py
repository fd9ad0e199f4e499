"""The simulation engine (``sim://``, ``memory://``): FoundationDB's optimistic concurrency in memory,
with seeded fault injection."""
