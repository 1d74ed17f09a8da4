"""legacy_upload_guard: the policy (``policy``) and its multipart part-header reader (``multipart_sniffer``)."""

from .policy import DISABLED_CODE, LEGACY_UPLOADS, NAME, SPEC, Families, Options, build

__all__ = ("DISABLED_CODE", "Families", "LEGACY_UPLOADS", "NAME", "Options", "SPEC", "build")
