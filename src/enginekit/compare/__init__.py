"""Comparison of candidate outputs with reference outputs: statistics, task metrics, gates, repair search."""
