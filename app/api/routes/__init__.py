"""Routers, one per subject."""
