"""Test fixtures shared by every tier, importable as `support.<module>` (pytest's pythonpath).

One home per fixture: tiny models, GGUF writers, llama.cpp helpers, kernel inputs and tolerances,
stand-in servers and targets. No test edits sys.path or loads a module by file path.
"""
