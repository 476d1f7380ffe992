"""Adapters that run other packages' environments through loomrl's own turn loop.

Each adapter imports its package lazily (inside its factory or ``check``), so
``import loomrl`` never needs the optional extras (``pip install 'loomrl[envs]'``).
"""
