from .engine import *  # noqa: F401,F403
from .engine import __all__  # noqa: F401
