"""A structure-aware mutator of multipart bodies: a client's body is split into its Content-Type, boundary, preamble,
parts (delimiter line, header lines, blank line, content) and epilogue, one to three mutations change those
elements, and the body is written again. Every mutation draws from the ``random.Random`` it is given, so a seed
gives the same bodies on every run. ``MUTATIONS`` names them, and ``truncate`` cuts the written bytes (the result
table counts bodies per mutation).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from tests.differential.clients import Sample

__all__ = ("MUTATIONS", "mutate")

CRLF = b"\r\n"


@dataclass
class Part:
    headers: list[bytes]
    content: bytes
    opening: bytes = CRLF  # what follows the delimiter
    eol: bytes = CRLF  # after each header line
    blank: bytes = CRLF  # the empty line after the headers
    tail: bytes = CRLF  # before the next delimiter


@dataclass
class Body:
    ct: str
    boundary: bytes  # the one the body uses; the Content-Type may say otherwise
    preamble: bytes
    parts: list[Part]
    closing: bytes = b"--"  # what follows the last delimiter
    epilogue: bytes = CRLF

    @property
    def delimiter(self) -> bytes:
        return b"--" + self.boundary

    def render(self) -> bytes:
        out = bytearray(self.preamble)
        for p in self.parts:
            out += self.delimiter + p.opening + b"".join(h + p.eol for h in p.headers) + p.blank + p.content + p.tail
        return bytes(out + self.delimiter + self.closing + self.epilogue)


_BOUNDARY = re.compile(r'(boundary)=(?:"([^"]*)"|([^;\s]*))', re.IGNORECASE)


def parse(sample: Sample) -> Body | None:
    """The structure of a well-formed client body, or None."""
    m = _BOUNDARY.search(sample.ct)
    if m is None:
        return None
    delimiter = b"--" + (m.group(2) if m.group(2) is not None else m.group(3)).encode()
    data = sample.body
    start = 0 if data.startswith(delimiter) else data.find(CRLF + delimiter) + 2
    if start == 1:
        return None
    pieces = (CRLF + data[start:]).split(CRLF + delimiter)
    if pieces[0] or not pieces[-1].startswith(b"--"):
        return None
    parts = []
    for piece in pieces[1:-1]:
        head, sep, content = piece[2:].partition(CRLF + CRLF)
        if not piece.startswith(CRLF) or not sep:
            return None
        parts.append(Part(head.split(CRLF) if head else [], content))
    return Body(sample.ct, delimiter[2:], data[:start], parts, b"--", pieces[-1][2:])


# --- helpers ----------------------------------------------------------------------------------------------------


def _part(rng: random.Random, body: Body) -> Part:
    if not body.parts:
        body.parts.append(Part([b'Content-Disposition: form-data; name="text"'], b"added"))
    return rng.choice(body.parts)


def _header_index(part: Part, name: bytes) -> int | None:
    for i, line in enumerate(part.headers):
        if line.split(b":", 1)[0].strip().lower() == name:
            return i
    return None


def _disposition(rng: random.Random, body: Body) -> tuple[Part, int]:
    part = _part(rng, body)
    i = _header_index(part, b"content-disposition")
    if i is None:
        part.headers.insert(0, b'Content-Disposition: form-data; name="added"')
        i = 0
    return part, i


def _file_part(name: bytes = b"files[]") -> Part:
    disposition = b'Content-Disposition: form-data; name="' + name + b'"; filename="x.txt"'
    return Part([disposition, b"Content-Type: text/plain"], b"file content")


# --- mutations --------------------------------------------------------------------------------------------------

Mutation = Callable[[random.Random, Body], None]


def preamble(rng: random.Random, body: Body) -> None:
    d = body.delimiter
    body.preamble = rng.choice((
        b"This is a multi-part message in MIME format.\r\n", CRLF, CRLF * 2, b"\r\npreamble with a - dash\r\n",
        b"preamble -- with dashes\r\n", b"x" + d + CRLF, d + b"X\r\n", d[:-1] + CRLF, b"pre\n", b"\n", b"\r",
        b"pre" + d + b'\r\nContent-Disposition: form-data; name="files[]"; filename="p.txt"\r\n\r\nhidden\r\n',
        b"\n" + d + b'\nContent-Disposition: form-data; name="files[]"; filename="p.txt"\n\nhidden\r\n',
        bytes(rng.choice(b"abc -_\r\n\t") for _ in range(rng.randint(1, 80))) + CRLF, b"p" * 3000 + CRLF,
    )) + (body.preamble if rng.random() < 0.2 else b"")


def epilogue(rng: random.Random, body: Body) -> None:
    d = body.delimiter
    body.epilogue = rng.choice((
        b"", CRLF, CRLF * 2, b"\r\nThis is the epilogue.", b"\r\nepilogue\r\n", b"epilogue", b"  \r\n", b"\n",
        b"--\r\n", b"\r\n" + d + b"--\r\n",
        b"\r\n" + d + b'\r\nContent-Disposition: form-data; name="files[]"; filename="e.txt"\r\n\r\nafter\r\n' + d
        + b"--\r\n",
        b"\r\n" + d + b'\r\nContent-Disposition: form-data; name="text"\r\n\r\nafter\r\n' + d + b"--\r\n",
    ))


def closing(rng: random.Random, body: Body) -> None:
    body.closing, body.epilogue = rng.choice((
        (b"--", b""), (b"-- ", CRLF), (b"--\t", CRLF), (b"---", CRLF), (b"--x", CRLF), (b"", b""), (b"-", b""),
        (b"--", b"\n"), (b"--", b"\r"), (b"", CRLF),
    ))


def line_endings(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    where = rng.choice(("opening", "eol", "blank", "tail", "all"))
    new = rng.choice((b"\n", b"\r", b"\n\r"))
    if where == "all":
        for p in body.parts:
            p.opening = p.eol = p.blank = p.tail = new
        if body.epilogue == CRLF:
            body.epilogue = new
    else:
        setattr(part, where, new)


def delimiter_padding(rng: random.Random, body: Body) -> None:
    _part(rng, body).opening = rng.choice((b" \r\n", b"\t\r\n", b"  \t \r\n", b"X\r\n", b"-\r\n", b"--x\r\n",
                                           b" x\r\n", b"\r\r\n"))


def delimiter_in_content(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    d = body.delimiter
    inserted = rng.choice((
        b"text" + d + b"text", CRLF + d + b"X", CRLF + d + b" \r\n", b"\n" + d + CRLF, CRLF + d + b"--", b"\r" + d,
        CRLF + d + b"-", d, CRLF + d[:-1], CRLF + d + CRLF,
        b"text" + d + b'\r\nContent-Disposition: form-data; name="files[]"; filename="m.txt"\r\n\r\nmid',
        b"\n" + d + b'\nContent-Disposition: form-data; name="files[]"; filename="m.txt"\n\nmid\n',
        CRLF + d + b'\r\nContent-Disposition: form-data; name="files[]"; filename="m.txt"\r\n\r\nmid',
    ))
    pos = rng.randint(0, len(part.content))
    part.content = part.content[:pos] + inserted + part.content[pos:]


def content(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    part.content = rng.choice((
        b"", CRLF, CRLF * 3, b"--", b"-- \r\n--", b'Content-Disposition: form-data; name="files[]"; filename="c.txt"',
        b"\r\nContent-Type: application/octet-stream\r\n\r\n", bytes(rng.randrange(256) for _ in range(64)),
        b"filename=c.txt", part.content * 2,
    ))


def header_case(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    part.headers = [_flip_name(rng, h) for h in part.headers]


def _flip_name(rng: random.Random, line: bytes) -> bytes:
    name, sep, rest = line.partition(b":")
    return rng.choice((name.lower(), name.upper(), name.swapcase())) + sep + rest


def header_fold(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    line = part.headers[i]
    cut = line.find(b";")
    cut = cut if cut != -1 else len(line)
    part.headers[i : i + 1] = [line[:cut + 1], rng.choice((b" ", b"\t", b"  ")) + line[cut + 1 :].lstrip()]


def header_syntax(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    if not part.headers:
        part.headers.append(b'Content-Disposition: form-data; name="x"')
    i = rng.randrange(len(part.headers))
    name, _, value = part.headers[i].partition(b":")
    part.headers[i] = rng.choice((
        name + b" :" + value, name + b":" + value.lstrip(), name + b":\t" + value.lstrip(), name + b":" + value + b"  ",
        name + value, name + b":" + value + b"\x00", name + b":" + value + b"\x7f", b" " + name + b":" + value,
        name + b"::" + value, name + b"_x:" + value, name + b":" + value + b"\xc3\xa9",
    ))


def extra_header(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    line = rng.choice((
        b"X-Note: 1", b"Content-Transfer-Encoding: base64", b"Content-Transfer-Encoding: binary",
        b"Content-Transfer-Encoding: quoted-printable", b"Content-Length: 3", b"Content-ID: <x>", b"NoColonLine",
        b"X-Delimiter: " + body.delimiter, b"X-Filename: a.txt", b"Content-Location: file:///etc/passwd",
        b'Content-Disposition: form-data; name="files[]"; filename="dup.txt"',
        b'Content-Disposition: form-data; name="b"',
        b"Content-Type: application/octet-stream", b"Content-Type: text/plain", b"MIME-Version: 1.0",
    ))
    part.headers.insert(rng.randint(0, len(part.headers)), line)


def content_type(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    value = rng.choice((
        b"text/plain", b"text/plain; charset=utf-8", b"TEXT/PLAIN", b"text/plain;charset=\"utf-8\"", b"text/html",
        b"application/octet-stream", b"image/png", b"application/json", b"text/plain; name=\"a.txt\"",
        b"multipart/mixed; boundary=inner", b"text", b"text/plain, image/png", b"", b"text/plain; x",
        b"application/x-www-form-urlencoded", b"message/rfc822",
    ))
    i = _header_index(part, b"content-type")
    if i is None or rng.random() < 0.3:
        part.headers.insert(rng.randint(0, len(part.headers)), b"Content-Type: " + value)
    else:
        part.headers[i] = b"Content-Type: " + value


def remove_header(rng: random.Random, body: Body) -> None:
    part = _part(rng, body)
    if part.headers:
        del part.headers[rng.randrange(len(part.headers))]


def disposition_type(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    kind = rng.choice((b"FORM-DATA", b"Form-Data", b"attachment", b"file", b"inline", b"formdata", b"form-data ",
                       b"form_data", b"", b'"form-data"', b"x-form-data"))
    part.headers[i] = re.sub(rb"(?i)(:\s*)form-data", lambda m: m.group(1) + kind, part.headers[i], count=1)


_FILENAME_PARAMS = (
    b'filename="x.txt"', b"filename=x.txt", b'filename=""', b'FILENAME="x.txt"', b"filename*=UTF-8''x.txt",
    b'filename*0="x"; filename*1=".txt"', b'filename="a.txt"; filename="b.txt"', b'file_name="x.txt"',
    b'filenames="x"', b'filename = "x.txt"', b"filename", b'filename="C:\\\\x.txt"', b"filename*=''",
    b'filename="x.txt";', b"filename='x.txt'",
)


def filename_param(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    line = re.sub(rb';\s*filename[^;]*', b"", part.headers[i]) if rng.random() < 0.3 else part.headers[i]
    param = rng.choice(_FILENAME_PARAMS)
    if rng.random() < 0.5:
        line = line + rng.choice((b"; ", b";", b" ;", b";\t")) + param
    else:
        line = line.replace(b"form-data", b"form-data; " + param, 1)
    part.headers[i] = line


def remove_filename(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    part.headers[i] = re.sub(rb";\s*filename\*?=(\"[^\"]*\"|[^;]*)", b"", part.headers[i])


_NAMES = (b"filename", b"files", b"files[]", b"file", b"FILES[]", b"files[0]", b"file[]", b"files []",
          b"files%5B%5D", b"", b"text", b"name", b"fi\\\"les", b"files.txt", b"filesize", b" files", b"files ")


def name_param(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    new = rng.choice(_NAMES)
    choice = rng.randrange(6)
    line = part.headers[i]
    if choice == 0:
        line = re.sub(rb'name=("[^"]*"|[^;\s]*)', b'name="' + new + b'"', line, count=1)
    elif choice == 1:
        line = re.sub(rb'name=("[^"]*"|[^;\s]*)', b"name=" + (new or b'""'), line, count=1)
    elif choice == 2:
        line = line + b'; name="' + new + b'"'
    elif choice == 3:
        line = re.sub(rb';\s*name=("[^"]*"|[^;\s]*)', b"", line, count=1)
    elif choice == 4:
        line = line + b"; name*=UTF-8''" + new.replace(b"[", b"%5B").replace(b"]", b"%5D")
    else:
        line = re.sub(rb'name=("[^"]*"|[^;\s]*)', b"NAME=\"" + new + b'"', line, count=1)
    part.headers[i] = line


def quoted_injection(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    injected = rng.choice((
        b"a; filename=x.txt", b"a; filename=x.txt; b", b'a\\"; filename=\\"x.txt', b"x; name=files[]",
        b"x; name=files[]; y", b"a filename=x", b"filename", b"a;filename=x", b"filename=", b"a\\", b"a\\\\",
        b"files[]", b"a%22; filename=%22x", b"a\r\n", b"a\xc3\xa9",
    ))
    line = part.headers[i]
    m = re.search(rb'"([^"]*)"', line)
    if m is None or rng.random() < 0.3:
        part.headers[i] = line + b'; x="' + injected + b'"'
    else:
        part.headers[i] = line[: m.start(1)] + injected + line[m.end(1) :]


def quoting(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    line = part.headers[i]
    choice = rng.randrange(5)
    if choice == 0:
        line = re.sub(rb'="([^"]*)"', rb"=\1", line, count=1)  # unquote
    elif choice == 1:
        line = re.sub(rb"=([^\";\s]+)", rb'="\1"', line, count=1)  # quote
    elif choice == 2:
        line = re.sub(rb'="([^"]*)"', rb"='\1'", line, count=1)  # single quotes
    elif choice == 3:
        line = line.rstrip(b'"')  # unterminated
    else:
        line = re.sub(rb'="([^"]*)"', rb'="\1"x', line, count=1)  # text after the quote
    part.headers[i] = line


def parameter_spacing(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    line = part.headers[i]
    part.headers[i] = rng.choice((
        line.replace(b"; ", b";"), line.replace(b"=", b" = ", 1), line.replace(b"; ", b" ; "), line + b";",
        line.replace(b"; ", b";; ", 1), line.replace(b"; ", b";\t"), line + b"; ", line.replace(b"; ", b", ", 1),
    ))


def extra_parameter(rng: random.Random, body: Body) -> None:
    part, i = _disposition(rng, body)
    param = rng.choice((
        b"size=3", b'x-filename="y.txt"', b"xname=files[]", b'foo="name=files[]"', b'creation-date="x"', b"x",
        b'name2="files[]"', b"filename_hint=a", b'x="a;filename=b.txt"', b'modification-date="Wed, 12 Feb 1997"',
        b'x="name=files[]"', b'x="a; name=files[]"', b'x="filename=y.txt"', b"x-name=files", b'comment="my name=x"',
    ))
    if rng.random() < 0.5:
        part.headers[i] += b"; " + param
    else:  # before the other parameters: a parser that takes the first match of "name=" reads this one
        part.headers[i] = re.sub(rb"(?i)(:\s*[^;]*)", lambda m: m.group(1) + b"; " + param, part.headers[i], count=1)


def nested(rng: random.Random, body: Body) -> None:
    inner = b"inner-" + body.boundary[-8:]
    d = b"--" + inner
    file_inside = rng.random() < 0.6
    inside = (b'Content-Disposition: file; filename="n.txt"\r\nContent-Type: text/plain\r\n\r\nnested file'
              if file_inside else b'Content-Disposition: form-data; name="x"\r\n\r\nnested text')
    subtype = rng.choice((b"mixed", b"form-data", b"related", b"alternative"))
    part = Part([b'Content-Disposition: form-data; name="' + rng.choice((b"files", b"attachments", b"text")) + b'"',
                 b"Content-Type: multipart/" + subtype + b"; boundary=" + inner],
                d + CRLF + inside + CRLF + d + b"--")
    if body.parts and rng.random() < 0.5:
        body.parts[rng.randrange(len(body.parts))] = part
    else:
        body.parts.insert(rng.randint(0, len(body.parts)), part)


def parts(rng: random.Random, body: Body) -> None:
    choice = rng.randrange(6)
    if choice == 0 and body.parts:
        del body.parts[rng.randrange(len(body.parts))]
    elif choice == 1 and body.parts:
        body.parts.insert(rng.randint(0, len(body.parts)), Part(list(rng.choice(body.parts).headers), b"dup"))
    elif choice == 2:
        rng.shuffle(body.parts)
    elif choice == 3:
        body.parts.insert(rng.randint(0, len(body.parts)), _file_part(rng.choice((b"files[]", b"attachment"))))
    elif choice == 4:
        body.parts.insert(rng.randint(0, len(body.parts)), Part([], b"no headers"))
    else:
        body.parts.insert(rng.randint(0, len(body.parts)),
                          Part([b'Content-Disposition: form-data; name="filename"'], b"report.pdf"))


# --- the Content-Type --------------------------------------------------------------------------------------------


def ct_spelling(rng: random.Random, body: Body) -> None:
    ct = body.ct
    body.ct = rng.choice((
        ct.replace("multipart/form-data", "Multipart/Form-Data"), ct.replace("boundary", "BOUNDARY"),
        ct.replace("; ", ";"), ct.replace("boundary=", "boundary = "), ct + ";", ct + "; charset=utf-8",
        "multipart/form-data; charset=utf-8; " + ct.split("; ", 1)[-1], ct.replace("; ", " ; "),
        _BOUNDARY.sub(lambda m: f'boundary="{m.group(2) or m.group(3)}"', ct),
        _BOUNDARY.sub(lambda m: f"boundary={m.group(2) or m.group(3)}", ct), ct + ' ; x="boundary=zzz"',
        ct + " (comment)", ct.replace("multipart/form-data", "multipart/form-data "),
    ))


def ct_parameters(rng: random.Random, body: Body) -> None:
    b = body.boundary.decode("latin-1")
    body.ct = rng.choice((
        f"{body.ct}; boundary=other", f"{body.ct}; boundary={b}", f"multipart/form-data; boundary=other; boundary={b}",
        f"{body.ct}; boundary*=UTF-8''{b}", f"{body.ct}; boundaryx=1", f"multipart/form-data; boundary={b[:-1]}",
        f"multipart/form-data; boundary={b}x", f"multipart/form-data; boundary={b}, text/plain",
        f"multipart/form-data; boundary={b}; charset=a; charset=b", f"multipart/form-data; boundary={b};boundary=",
    ))


def ct_type(rng: random.Random, body: Body) -> None:
    b = body.boundary.decode("latin-1")
    body.ct = rng.choice((
        f"multipart/mixed; boundary={b}", f"multipart/related; boundary={b}", f"multipart/form-data-x; boundary={b}",
        f"text/plain; boundary={b}", f'text/plain; x="multipart/form-data"; boundary={b}', f"multipart; boundary={b}",
        f"application/x-www-form-urlencoded; boundary={b}", f"multipart/form-data, text/plain; boundary={b}",
        f"form-data; boundary={b}", f"multipart/*; boundary={b}",
    ))


def ct_boundary(rng: random.Random, body: Body) -> None:
    """Another boundary, written in the body and in the Content-Type."""
    new = rng.choice((
        "a b", "a=b", "a:b", "(a)", "a?b", "a/b", "a,b", "a'b", "+.-_", "x" * 70, "x" * 71, "a" + "-" * 40, "=_=",
        "a\tb", "ab ", "a;b", "é", "-", "--", "a\\b",
    ))
    old = body.boundary
    quoted = rng.random() < 0.6
    body.ct = _BOUNDARY.sub(lambda m: f'boundary="{new}"' if quoted else f"boundary={new}", body.ct, count=1)
    body.boundary = new.encode()
    for p in body.parts:
        p.content = p.content.replace(b"--" + old, b"--" + body.boundary)
    body.preamble = body.preamble.replace(b"--" + old, b"--" + body.boundary)


# "truncate" (cut the body anywhere) is applied to the written bytes.
MUTATIONS: dict[str, Mutation] = {f.__name__: f for f in (
    preamble, epilogue, closing, line_endings, delimiter_padding, delimiter_in_content, content,
    header_case, header_fold, header_syntax, extra_header, content_type, remove_header, disposition_type,
    filename_param, remove_filename, name_param, quoted_injection, quoting, parameter_spacing, extra_parameter,
    nested, parts, ct_spelling, ct_parameters, ct_type, ct_boundary,
)}


_CHOICES = (*MUTATIONS, "truncate")


def mutate(rng: random.Random, sample: Sample) -> Sample | None:
    """One to three mutations of a client's body (None if the body has no structure to mutate), and half of the
    time the chunks it reaches the guard in."""
    body = parse(sample)
    if body is None:
        return None
    names = [rng.choice(_CHOICES) for _ in range(rng.choice((1, 1, 2, 2, 3)))]
    for name in names:
        if name != "truncate":
            MUTATIONS[name](rng, body)
    data = body.render()
    if "truncate" in names and len(data) > 1:  # the structure ends with it: applied to the bytes, last
        data = data[: rng.randint(1, len(data) - 1)]
    chunks: tuple[int, ...] = ()
    if rng.random() < 0.5 and len(data) > 1:
        sizes: list[int] = []
        left = len(data)
        while left > 0 and len(sizes) < 40:
            sizes.append(min(left, rng.choice((1, 2, 3, 7, 16, 64, 256))))
            left -= sizes[-1]
        chunks = tuple(sizes)
    return Sample(f"{sample.family}+{'+'.join(sorted(set(names)))}", body.ct, data, chunks)
