"""Trace-driven cluster simulator (SPEC §7): profiles, workloads, the engine and reports."""
