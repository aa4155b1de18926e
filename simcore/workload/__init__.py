"""Workload sources and loads: which requests exist and when they are sent."""
