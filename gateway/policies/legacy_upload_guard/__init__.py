from .policy import DISABLED_CODE, NAME, Options, build, forbid_in_force

__all__ = ("DISABLED_CODE", "NAME", "Options", "build", "forbid_in_force")
