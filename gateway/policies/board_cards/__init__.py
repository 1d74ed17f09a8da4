from .policy import NAME, Options, build

__all__ = ("NAME", "Options", "build")
