"""One file per schema revision, oldest first (0001, 0002, ...): ``upgrade()`` and ``downgrade()``."""
