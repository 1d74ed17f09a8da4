"""Bodies on which the differential harness (tests/differential) found the guard and the real multipart parsers at
odds, kept as fixed cases. Each is sent through a real gateway by test_legacy_upload_corpus.py and read by every
parser by tests/differential/test_differential.py, which checks the invariants on it.

``found`` says what the harness saw before the guard was changed; ``expect`` is the answer now; ``parsers`` are the
parsers that read the body differently from the others (``Outcome.motivation``), as they do today.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tests.gateway_testlib import multipart_body

__all__ = ("B", "DISAGREEMENTS", "Disagreement")

B = "dif-B0undary.3"
CT = f"multipart/form-data; boundary={B}"
TEXT = (['Content-Disposition: form-data; name="text"'], b"edited comment")
FILE = (['Content-Disposition: form-data; name="files[]"; filename="a.txt"', "Content-Type: text/plain"], b"file")


def _one(*headers: str, content: bytes = b"x") -> bytes:
    return multipart_body([TEXT, (list(headers), content)], B)


@dataclass(frozen=True)
class Disagreement:
    id: str
    body: bytes
    expect: Literal["passed", "blocked", "refused"]
    found: str
    parsers: tuple[str, ...]
    rule: str | None = None
    ct: str = CT


EMAIL_BOUNDARY = "===============4815162342108151623=="

ALL = ("busboy", "formidable", "python-multipart", "werkzeug", "aiohttp")

DISAGREEMENTS: tuple[Disagreement, ...] = (
    # --- legitimate bodies that were refused (every parser that accepts them sees no file part) -------------------
    Disagreement(
        "preamble-and-epilogue-text-only",
        b"This is a multi-part message in MIME format.\r\n" + multipart_body([TEXT], B) + b"Epilogue.\r\n",
        "passed", "400 preamble; Python's email package writes both; python-multipart rejects a preamble",
        ("python-multipart",)),
    Disagreement(
        "text-field-named-filename", _one('Content-Disposition: form-data; name="filename"', content=b"a.pdf"),
        "passed", "400 filename_outside_parameter: the word, not a parameter", ()),
    Disagreement(
        "escaped-quote-in-a-text-name", _one('Content-Disposition: form-data; name="say \\"hi\\""'),
        "passed", "400 malformed_disposition; Go's and Python's MIME writers and aiohttp escape quotes so; formidable "
        "reads the name as 'say \\\\', the others as 'say \"hi\"': neither is a file field", ("formidable",)),
    Disagreement(
        "quoted-boundary-with-equals-signs", multipart_body([TEXT], EMAIL_BOUNDARY),
        "passed", "400 boundary_characters; Python's email package's own boundary, read alike by every parser", (),
        ct=f'multipart/form-data; boundary="{EMAIL_BOUNDARY}"'),
    Disagreement(
        "extended-text-name", _one("Content-Disposition: form-data; name*=utf-8''%C3%A9t%C3%A9"),
        "passed", "400 extended_name; Python's email package writes non-ASCII names so (Werkzeug and aiohttp decode "
        "them, busboy and formidable read no name, python-multipart rejects the part)",
        ("python-multipart", "werkzeug", "aiohttp")),
    # --- file parts answered 400 instead of the spec's 403 ---------------------------------------------------------
    Disagreement(
        "preamble-then-a-file-part", b"preamble\r\n" + multipart_body([TEXT, FILE], B),
        "blocked", "400 preamble; every parser but python-multipart (which rejects it) sees the file part", ALL),
    Disagreement(
        "nested-multipart-mixed-with-a-file",
        _one('Content-Disposition: form-data; name="attachments"', "Content-Type: multipart/mixed; boundary=in",
             content=b'--in\r\nContent-Disposition: file; filename="n.txt"\r\n\r\nnested\r\n--in--'),
        "blocked", "400 nested_multipart; aiohttp reads the nested file, formidable takes the part for a file",
        ("formidable", "aiohttp")),
    Disagreement(
        "ambiguous-part-then-a-file-part",
        multipart_body([(['Content-Disposition: formdata; name="text"'], b"x"), FILE], B),
        "blocked", "400 disposition_type; busboy skips the first part, every parser sees the file part", ALL),
    Disagreement(
        "escaped-quote-in-a-filename", _one('Content-Disposition: form-data; name="files[]"; filename="q\\".txt"'),
        "blocked", "400 malformed_disposition; Go's mime/multipart writes such names; every parser sees the file",
        ("busboy", "python-multipart", "werkzeug", "aiohttp")),
    Disagreement(
        "extended-name-of-a-file-field", _one("Content-Disposition: form-data; name*=UTF-8''files%5B%5D"),
        "blocked", "400 extended_name; Werkzeug and aiohttp decode the field name files[]",
        ("python-multipart", "werkzeug", "aiohttp")),
    Disagreement(
        "escaped-quote-after-a-file-field-name", _one('Content-Disposition: form-data; name="files[]\\"x"'),
        "blocked", "400 malformed_disposition; formidable reads the field name 'files[]\\\\'", ("formidable",)),
    # --- bodies the guard forwarded although a parser sees a file part ---------------------------------------------
    Disagreement(
        "name-ending-another-parameter", _one('Content-Disposition: form-data; x-name=files; name="text2"'),
        "refused", "forwarded; formidable reads the field name 'files' (its first match of name=)", ("formidable",),
        "name_outside_parameter"),
    Disagreement(
        "name-inside-a-quoted-value", _one('Content-Disposition: form-data; x="a; name=files[]"; name="text2"'),
        "refused", "forwarded; formidable reads the field name 'files[]'", ("formidable",), "name_outside_parameter"),
    # --- still refused, for what a parser makes of them ------------------------------------------------------------
    Disagreement(
        "delimiter-in-the-epilogue", multipart_body([TEXT], B) + multipart_body([FILE], B),
        "refused", "400 epilogue (any epilogue); now only an epilogue holding the delimiter: no parser of the harness "
        "reads past the close delimiter (docs: kept for those that do)", (), "epilogue"),
    Disagreement(
        "delimiter-mid-line-in-the-preamble",
        b"x--" + B.encode() + b'\r\nContent-Disposition: form-data; name="files[]"; filename="p.txt"\r\n\r\n'
        b"hidden\r\n" + multipart_body([TEXT], B),
        "refused", "400 preamble; Werkzeug starts a part there and sees the file, busboy does not",
        ("python-multipart", "werkzeug"), "preamble"),
)
