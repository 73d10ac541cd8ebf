"""The training code."""
