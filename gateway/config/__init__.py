"""The configuration: the file (``document``), its ``${NAME}`` references and what they make secret (``secrets``),
its schema (``schema``, and each section's options: ``upstream``, ``ledger``, ``tracing``), the problems found in it
(``problems``), and the config checked whole (``loaded``). A schema the other parts read: it imports no policy, no
proxy and no aiohttp."""

from .document import Document, read_document, read_yaml
from .loaded import LoadedConfig
from .problems import ConfigError, loc, pydantic_problems
from .schema import (
    ADMIN_PATHS,
    ChainEntry,
    GatewayConfig,
    ListenAddress,
    RouteConfig,
    ServerConfig,
    TenantConfig,
    parse_listen,
    parse_model,
)
from .secrets import Secrets, expand_references

__all__ = (
    "ADMIN_PATHS",
    "ChainEntry",
    "ConfigError",
    "Document",
    "GatewayConfig",
    "ListenAddress",
    "LoadedConfig",
    "RouteConfig",
    "Secrets",
    "ServerConfig",
    "TenantConfig",
    "expand_references",
    "loc",
    "parse_listen",
    "parse_model",
    "pydantic_problems",
    "read_document",
    "read_yaml",
)
