"""Claim traces for the prewarming replay (bench/b8_prewarm.py): `generate` makes
them from a seed."""
