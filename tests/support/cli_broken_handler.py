"""A handler module that fails on import (the worker must report it in one line)."""

raise RuntimeError("this module is broken on purpose")
