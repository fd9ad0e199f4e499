"""The in-process engines' shared half: a transaction over a read-your-writes write map."""
