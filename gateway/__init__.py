"""The deprecation gateway: an async reverse proxy that enforces a service's API deprecations at the edge."""

__all__ = ("__version__",)

__version__ = "0.1.0"
