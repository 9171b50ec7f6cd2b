"""Pollux: goodput-optimised, co-adaptive scheduling for deep-learning clusters."""

__version__ = "0.1.0"
