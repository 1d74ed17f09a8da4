"""The multipart cases the guard's sniffer and the upload splitter are both held to: each body with the verdict and
the rule it must get, and ``sniff``, which feeds a body to the sniffer in given pieces."""

from __future__ import annotations

from typing import Any

from gateway.core.multipart import Ambiguous, Boundary
from gateway.policies.legacy_upload_guard.multipart_sniffer import MultipartSniffer, Verdict
from tests.gateway_testlib import multipart_body

B = "sniff-B0undary"
TEXT = (['Content-Disposition: form-data; name="text"'], b"hello")
FILE = (['Content-Disposition: form-data; name="files[]"; filename="a.txt"', "Content-Type: text/plain"], b"data")


def sniff(body: bytes, *, chunks: list[int] | None = None, quoted: bool = False, **kw: Any) -> tuple[Verdict, str]:
    """Feed ``body`` in the given chunk sizes (all of it by default) and return the verdict and its reason/rule."""
    sniffer = MultipartSniffer(Boundary(B.encode(), quoted), file_fields=("files", "file"), **kw)
    pos = 0
    try:
        for size in chunks or [len(body)]:
            if sniffer.feed(body[pos : pos + size]) is Verdict.FILE:
                assert sniffer.finding is not None
                return Verdict.FILE, sniffer.finding.reason
            pos += size
        if pos < len(body) and sniffer.feed(body[pos:]) is Verdict.FILE:
            assert sniffer.finding is not None
            return Verdict.FILE, sniffer.finding.reason
        return sniffer.feed_eof(), ""
    except Ambiguous as err:
        return Verdict.NEED_MORE, err.rule


def part(*headers: str, content: bytes = b"x") -> tuple[list[str], bytes]:
    return list(headers), content


SNIFF_CASES: list[tuple[str, bytes, Verdict, str]] = [
    ("text only", multipart_body([TEXT], B), Verdict.NO_FILE, ""),
    ("no parts", f"--{B}--\r\n".encode(), Verdict.NO_FILE, ""),
    ("no final CRLF", multipart_body([TEXT], B, close=b"--"), Verdict.NO_FILE, ""),
    ("text/plain part", multipart_body([part('Content-Disposition: form-data; name="a"', "Content-Type: TEXT/Plain; charset=utf-8")], B), Verdict.NO_FILE, ""),
    ("other headers ignored", multipart_body([part('Content-Disposition: form-data; name="a"', "X-Any: 1")], B), Verdict.NO_FILE, ""),
    ("field name that only looks like file", multipart_body([part('Content-Disposition: form-data; name="filesize"')], B), Verdict.NO_FILE, ""),
    ("CRLF-looking content", multipart_body([part('Content-Disposition: form-data; name="a"', content=b"\r\n-- not a delimiter\r\n-")], B), Verdict.NO_FILE, ""),
    ("filename", multipart_body([TEXT, FILE], B), Verdict.FILE, "filename parameter"),
    ("filename*", multipart_body([part("Content-Disposition: form-data; name=a; filename*=UTF-8''x")], B), Verdict.FILE, "filename parameter"),
    ("FileName", multipart_body([part("Content-Disposition: form-data; name=a; FileName=x")], B), Verdict.FILE, "filename parameter"),
    ("octet-stream", multipart_body([part('Content-Disposition: form-data; name="a"', "Content-Type: application/octet-stream")], B), Verdict.FILE, "content type application/octet-stream"),
    ("json part", multipart_body([part('Content-Disposition: form-data; name="a"', "Content-Type: application/json")], B), Verdict.FILE, "content type application/json"),
    ("files[] field", multipart_body([part('Content-Disposition: form-data; name="files[]"')], B), Verdict.FILE, "field name 'files[]'"),
    ("FILE field", multipart_body([part('Content-Disposition: form-data; name="FILE"')], B), Verdict.FILE, "field name 'FILE'"),
    ("files[3] field", multipart_body([part('Content-Disposition: form-data; name="files[3]"')], B), Verdict.FILE, "field name 'files[3]'"),
    ("file found before a broken tail", multipart_body([FILE], B) + b"garbage", Verdict.FILE, "filename parameter"),
    ("preamble", b"This is a preamble.\r\n" + multipart_body([TEXT], B), Verdict.NO_FILE, ""),
    ("preamble of line ends", b"\r\n\r\n" + multipart_body([TEXT], B), Verdict.NO_FILE, ""),
    ("preamble then a file part", b"preamble\r\n" + multipart_body([TEXT, FILE], B), Verdict.FILE, "filename parameter"),
    ("boundary mid-line in the preamble", b"x" + multipart_body([TEXT], B), Verdict.NEED_MORE, "preamble"),
    ("LF before the first delimiter", b"preamble\n" + multipart_body([TEXT], B), Verdict.NEED_MORE, "line_endings"),
    ("longer boundary in the preamble", f"--{B}X\r\n".encode() + multipart_body([TEXT], B), Verdict.NEED_MORE, "delimiter_suffix"),
    ("empty", b"", Verdict.NEED_MORE, "unterminated_body"),
    ("unterminated", multipart_body([TEXT], B)[:-8], Verdict.NEED_MORE, "unterminated_body"),
    ("bare LF after delimiter", multipart_body([TEXT], B).replace(f"--{B}\r\n".encode(), f"--{B}\n".encode()), Verdict.NEED_MORE, "line_endings"),
    ("bare LF in headers", multipart_body([part('Content-Disposition: form-data; name="a"\nX: y')], B), Verdict.NEED_MORE, "line_endings"),
    ("bare CR in headers", multipart_body([part('Content-Disposition: form-data; name="a"\rX: y')], B), Verdict.NEED_MORE, "line_endings"),
    ("LF before delimiter", multipart_body([TEXT], B).replace(b"hello\r\n", b"hello\n"), Verdict.NEED_MORE, "line_endings"),
    ("padding after delimiter", multipart_body([TEXT], B).replace(f"--{B}\r\n".encode(), f"--{B}\t\r\n".encode()), Verdict.NEED_MORE, "delimiter_suffix"),
    ("longer boundary in body", multipart_body([TEXT], B).replace(b"hello", f"x\r\n--{B}X".encode()), Verdict.NEED_MORE, "delimiter_suffix"),
    ("delimiter right after headers", f"--{B}\r\nContent-Disposition: form-data; name=a\r\n\r\n--{B}--\r\n".encode(), Verdict.NEED_MORE, "delimiter_not_on_own_line"),
    ("epilogue", multipart_body([TEXT], B) + b"This is the epilogue.\r\n", Verdict.NO_FILE, ""),
    ("epilogue without CRLF", multipart_body([TEXT], B, close=b"--epilogue"), Verdict.NO_FILE, ""),
    ("delimiter in the epilogue", multipart_body([TEXT], B) + multipart_body([FILE], B), Verdict.NEED_MORE, "epilogue"),
    ("folded", multipart_body([part("Content-Disposition: form-data;", ' name="a"')], B), Verdict.NEED_MORE, "folded_header"),
    ("no colon", multipart_body([part('Content-Disposition form-data; name="a"')], B), Verdict.NEED_MORE, "malformed_part_header"),
    ("control char", multipart_body([part('Content-Disposition: form-data; name="a\x01"')], B), Verdict.NEED_MORE, "malformed_part_header"),
    ("no headers", f"--{B}\r\n\r\nx\r\n--{B}--\r\n".encode(), Verdict.NEED_MORE, "missing_disposition"),
    ("no disposition", multipart_body([part("Content-Type: text/plain")], B), Verdict.NEED_MORE, "missing_disposition"),
    ("two dispositions", multipart_body([part("Content-Disposition: form-data; name=a", "Content-Disposition: form-data; name=b")], B), Verdict.NEED_MORE, "duplicate_part_content_disposition"),
    ("two transfer encodings", multipart_body([part("Content-Disposition: form-data; name=a", "Content-Transfer-Encoding: 8bit", "Content-Transfer-Encoding: base64")], B), Verdict.NEED_MORE, "duplicate_part_content_transfer_encoding"),
    ("duplicate name", multipart_body([part("Content-Disposition: form-data; name=a; NAME=b")], B), Verdict.NEED_MORE, "duplicate_disposition_parameter"),
    ("param without value", multipart_body([part("Content-Disposition: form-data; name=a; filename")], B), Verdict.NEED_MORE, "malformed_disposition"),
    ("space around =", multipart_body([part("Content-Disposition: form-data; name = a")], B), Verdict.NEED_MORE, "malformed_disposition"),
    ("quoted-pair", multipart_body([part('Content-Disposition: form-data; name="a\\"b"')], B), Verdict.NO_FILE, ""),
    ("quoted-pair in a filename", multipart_body([part('Content-Disposition: form-data; name="a"; filename="q\\".txt"')], B), Verdict.FILE, "filename parameter"),
    ("quoted-pair after a file field name", multipart_body([part('Content-Disposition: form-data; name="files[]\\"x"')], B), Verdict.FILE, "field name 'files[]\\\\'"),
    ("quoted-pair hiding a filename", multipart_body([part('Content-Disposition: form-data; name="a\\"; filename=\\"x"')], B), Verdict.NEED_MORE, "filename_outside_parameter"),
    ("backslash outside quotes", multipart_body([part('Content-Disposition: form-data; name=a\\b')], B), Verdict.NEED_MORE, "malformed_disposition"),
    ("field named filename", multipart_body([part('Content-Disposition: form-data; name="filename"')], B), Verdict.NO_FILE, ""),
    ("filename= in a value", multipart_body([part('Content-Disposition: form-data; name="a; filename=x"')], B), Verdict.NEED_MORE, "filename_outside_parameter"),
    ("filename= ending a parameter name", multipart_body([part('Content-Disposition: form-data; name="a"; x-filename="y"')], B), Verdict.NEED_MORE, "filename_outside_parameter"),
    ("name= ending a parameter name", multipart_body([part('Content-Disposition: form-data; x-name=files; name="a"')], B), Verdict.NEED_MORE, "name_outside_parameter"),
    ("name= in a value", multipart_body([part('Content-Disposition: form-data; x="a; name=files[]"; name="a"')], B), Verdict.NEED_MORE, "name_outside_parameter"),
    ("name*", multipart_body([part("Content-Disposition: form-data; name*=UTF-8''%C3%A9t%C3%A9")], B), Verdict.NO_FILE, ""),
    ("name* naming a file field", multipart_body([part("Content-Disposition: form-data; name=\"a\"; name*=UTF-8''files%5B%5D")], B), Verdict.FILE, "field name 'files[]'"),
    ("name*0", multipart_body([part("Content-Disposition: form-data; name*0=a; name*1=b")], B), Verdict.NEED_MORE, "extended_name"),
    ("no name", multipart_body([part("Content-Disposition: form-data")], B), Verdict.NEED_MORE, "missing_name"),
    ("inline", multipart_body([part("Content-Disposition: inline; name=a")], B), Verdict.NEED_MORE, "disposition_type"),
    ("nested", multipart_body([part("Content-Disposition: form-data; name=a", "Content-Type: multipart/mixed; boundary=z")], B), Verdict.FILE, "content type multipart/mixed"),
    # A rule broken in a part's headers waits for the end of the body: a later file part wins over it.
    ("ambiguous part, then a file part", multipart_body([part("Content-Disposition: formdata; name=a"), FILE], B), Verdict.FILE, "filename parameter"),
    ("ambiguous part, then text", multipart_body([part("Content-Disposition: formdata; name=a"), TEXT], B), Verdict.NEED_MORE, "disposition_type"),
    ("first rule met is the answer", multipart_body([part("Content-Disposition: form-data"), part("Content-Disposition: inline; name=a")], B), Verdict.NEED_MORE, "missing_name"),
    ("ambiguous part, then a broken structure", multipart_body([part("Content-Disposition: form-data"), TEXT], B).replace(b"hello\r\n", b"hello\n"), Verdict.NEED_MORE, "missing_name"),
    ("folded filename", multipart_body([part("Content-Disposition: form-data; name=a;", ' filename="x"')], B), Verdict.FILE, "filename parameter"),
    ("filename in a non-form-data part", multipart_body([part('Content-Disposition: attachment; name="a"; filename="x"')], B), Verdict.FILE, "filename parameter"),
    ("second disposition with a filename", multipart_body([part("Content-Disposition: form-data; name=a", "Content-Disposition: form-data; name=a; filename=b")], B), Verdict.FILE, "filename parameter"),
    ("headerless part, then a file part", f"--{B}\r\n\r\nx\r\n".encode() + multipart_body([FILE], B), Verdict.FILE, "filename parameter"),
    ("bad part type", multipart_body([part("Content-Disposition: form-data; name=a", "Content-Type: text")], B), Verdict.NEED_MORE, "malformed_part_content_type"),
    ("delimiter in headers", multipart_body([part("Content-Disposition: form-data; name=a", f"X-A: --{B}")], B), Verdict.NEED_MORE, "delimiter_in_headers"),
    ("huge headers", multipart_body([part("Content-Disposition: form-data; name=a", "X-A: " + "a" * 2000)], B), Verdict.NEED_MORE, "part_headers_too_large"),
]
