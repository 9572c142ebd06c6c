"""Helpers shared by tests in several folders (and by bench/): import from
here, never from conftest.py or from another test module."""
