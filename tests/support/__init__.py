"""Helpers shared by tests that need more than one process: network namespaces standing in for machines or pods."""
