"""The configuration: the YAML file and its schema, every section's options included (``schema``, ``upstream``,
``ledger``). A schema the other parts read: it imports no policy, no proxy and no aiohttp."""

from .schema import *  # noqa: F403 - the package's names are the schema module's
from .schema import __all__ as __all__
