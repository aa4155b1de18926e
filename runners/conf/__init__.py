"""Hydra configs of the ``replaysim`` command, shipped as package data.

Hydra reads a config package (``pkg://runners.conf``) only if it has this file.
"""
