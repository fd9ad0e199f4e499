"""The embedded engine (``sqlite://``): one SQLite file, safe for many threads and processes."""
