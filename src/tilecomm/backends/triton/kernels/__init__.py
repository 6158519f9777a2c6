"""Kernel families (one module each); each registers launchers with ``registry.kernel`` and
lists its ``COMPILE`` entries for the sm_90 compile check. Importing a family imports triton."""
