"""Reproducible, gated GPU training images from a declared matrix."""

__version__ = "0.1.0"
