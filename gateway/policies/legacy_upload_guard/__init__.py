"""legacy_upload_guard: the policy (``policy``), its multipart part-header reader (``multipart_sniffer``), and the
upload upgrade bridge (``upgrade``) with the reader that reads a body to its end (``multipart_splitter``)."""

from .policy import DISABLED_CODE, LEGACY_UPLOADS, NAME, SPEC, Families, Options, build

__all__ = ("DISABLED_CODE", "Families", "LEGACY_UPLOADS", "NAME", "Options", "SPEC", "build")
