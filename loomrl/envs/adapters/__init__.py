"""Adapters to other packages' environments, registered as families in ``loomrl.envs``.

Each adapter imports its package only when one of its environments is checked or built,
so ``import loomrl`` never needs the optional extras (``pip install 'loomrl[envs]'``).
"""
