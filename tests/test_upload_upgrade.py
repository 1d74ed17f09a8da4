"""The upload upgrade bridge's parts alone: the multipart splitter (byte by byte, and against every body the guard's
sniffer refuses), the options and their errors, the rollout wiring, and the shapes it writes (no sockets: the
integration tests have those)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import ConfigError, parse_config
from gateway.cli import main
from gateway.policies.legacy_upload_guard import LEGACY_UPLOADS
from gateway.core.multipart import Ambiguous, Boundary
from gateway.policies.legacy_upload_guard.multipart_sniffer import Verdict
from gateway.policies.legacy_upload_guard.multipart_splitter import PART_END, Event, MultipartSplitter, PartHead
from gateway.policies.legacy_upload_guard.upgrade import UpgradeOptions
from gateway.policies.legacy_upload_guard.upgrade import form_head as _form_head, legacy_file as _legacy_file
from sandbox.fault_types import FaultTable
from tests.gateway_testlib import guarded_routes, make_config, multipart_body
from tests.multipart_testlib import SNIFF_CASES, B, sniff

# The splitter's rules beyond the sniffer's.
BRIDGE_RULES = ("extended_name", "content_transfer_encoding", "nested_multipart")
TEXT = (['Content-Disposition: form-data; name="text"'], b"hello")
FILE = (['Content-Disposition: form-data; name="files[]"; filename="a.txt"', "Content-Type: text/plain"], b"data")


def split(body: bytes, sizes: list[int] | None = None, quoted: bool = False) -> list[Event]:
    # The part-header bound the sniffer's own table of cases is read with.
    splitter = MultipartSplitter(Boundary(B.encode(), quoted), file_fields=("files", "file"), max_header_bytes=1024)
    events: list[Event] = []
    pos = 0
    for size in sizes or [len(body)]:
        events += splitter.split(body[pos : pos + size])
        pos += size
    if pos < len(body):
        events += splitter.split(body[pos:])
    return events + splitter.end()


def parts_of(events: list[Event]) -> list[tuple[PartHead, bytes]]:
    """(head, whole content) per part; checks the events' order on the way."""
    out: list[tuple[PartHead, bytes]] = []
    head: PartHead | None = None
    content = bytearray()
    for event in events:
        if isinstance(event, PartHead):
            assert head is None
            head, content = event, bytearray()
        elif event is PART_END:
            assert head is not None
            out.append((head, bytes(content)))
            head = None
        else:
            assert head is not None and isinstance(event, bytes) and event
            content += event
    assert head is None
    return out


# --- the splitter -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "body", "verdict", "rule"), SNIFF_CASES, ids=[c[0] for c in SNIFF_CASES])
def test_the_splitter_refuses_every_body_the_sniffer_refuses(name: str, body: bytes, verdict: Verdict,
                                                             rule: str) -> None:
    """A body the guard would refuse is never translated: whatever the sniffer refuses, the splitter refuses too,
    however the body is chunked (and what the sniffer passes, the splitter reads to the same parts)."""
    for sizes in (None, [1] * len(body), [7] * (len(body) // 7 + 1)):
        if verdict is Verdict.NEED_MORE:
            with pytest.raises(Ambiguous):
                split(body, sizes)
            continue
        try:
            parts = parts_of(split(body, sizes))
        except Ambiguous as err:
            # Stricter than the sniffer only where a file part let the sniffer stop reading, or by a rule that only
            # matters to a translation.
            assert verdict is Verdict.FILE or err.rule in BRIDGE_RULES, (name, err.rule)
            continue
        assert (verdict is Verdict.FILE) == any(h.is_file for h, _ in parts), name


@pytest.mark.parametrize("quoted", [False, True])
def test_parts_and_contents_survive_any_chunking(quoted: bool) -> None:
    rng = random.Random(7)
    tricky = b"\r\n--" + B.encode()[:-1] + b"\r\n-" + b"--" + b"\r" * 3
    contents = [b"", b"x", tricky * 50, bytes(rng.randrange(256) for _ in range(5000)) + b"\r\n"]
    parts = [TEXT] + [(["Content-Disposition: form-data; name=\"files[]\"; filename=\"f%d\"" % i,
                        "Content-Type: application/octet-stream"], c) for i, c in enumerate(contents)]
    body = b"preamble\r\n" + multipart_body(parts, B) + b"epilogue"
    for n in range(60):
        # Small reads go through the buffer; larger ones take the path that hands content out without it.
        top = 300 if n % 2 else 5000
        sizes = [rng.randint(1, top) for _ in range(len(body))]
        got = parts_of(split(body, sizes, quoted))
        assert [c for _, c in got] == [b"hello", *contents]
        assert [h.name for h, _ in got] == ["text"] + ["files[]"] * 4
        assert [h.filename for h, _ in got] == [None, "f0", "f1", "f2", "f3"]
        assert [h.is_file for h, _ in got] == [False] + [True] * 4


def test_heads_are_read_as_parsers_read_them() -> None:
    body = multipart_body([
        (["Content-Disposition: form-data; name=\"a\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf; filename=\"x.pdf\"",
          "Content-Type: Application/PDF; name=x"], b"1"),
        (['Content-Disposition: form-data; name="b"; filename="café.txt"',  # raw UTF-8, as browsers send it
          "Content-Transfer-Encoding: binary"], b"2"),
        (["Content-Disposition: form-data; name=file"], b"3"),
    ], B)
    (a, _), (b, _), (c, _) = parts_of(split(body))
    assert (a.filename, a.content_type, a.file_reason) == ("résumé.pdf", "application/pdf", "filename parameter")
    assert b.filename == "café.txt" and b.content_type is None
    assert (c.name, c.filename, c.file_reason) == ("file", None, "field name 'file'")
    assert a.raw.startswith(b"Content-Disposition: form-data; name=\"a\"")


@pytest.mark.parametrize(("parts", "rule"), [
    ([(['Content-Disposition: form-data; name="t"', "X: y", " folded"], b"t"), FILE], "folded_header"),
    ([(["Content-Disposition: form-data; name*=UTF-8''files%5B%5D"], b"x")], "extended_name"),
    ([(['Content-Disposition: form-data; name="f"; filename="a"', "Content-Transfer-Encoding: base64"], b"eA==")],
     "content_transfer_encoding"),
    ([(['Content-Disposition: form-data; name="f"', "Content-Type: multipart/mixed; boundary=zz"], b"--zz--")],
     "nested_multipart"),
    ([FILE, (['Content-Disposition: form-data; name="t"'], b"a\r\n--" + B.encode() + b"x")], "delimiter_suffix"),
])
def test_the_splitter_is_strict_where_a_translation_needs_it(parts: list[tuple[list[str], bytes]],
                                                             rule: str) -> None:
    body = multipart_body(parts, B)
    with pytest.raises(Ambiguous) as info:
        split(body)
    assert info.value.rule == rule
    if rule == "folded_header":
        assert sniff(body) == (Verdict.FILE, "filename parameter")  # the guard alone would answer 403


def test_a_quoted_boundarys_alternate_delimiter_is_found_across_any_two_feeds() -> None:
    """A parser that keeps the quotes of a quoted boundary reads ``--"B`` as a delimiter: found inside a file's
    content (past the sniffer's look-ahead) wherever the feeds split it."""
    content = b"z" * 300 + b'\r\n--"' + B.encode() + b"\r\n" + b"z" * 300
    body = multipart_body([(['Content-Disposition: form-data; name="file"; filename="a"'], content)], B)
    at = body.index(b'--"')
    for cut in range(at - 5, at + len(B) + 8):
        with pytest.raises(Ambiguous) as info:
            split(body, [cut], quoted=True)
        assert info.value.rule == "alternate_delimiter", cut
    assert parts_of(split(body, [at + 2], quoted=False))[0][1] == content  # unquoted: it is content


def test_memory_stays_bounded_however_large_a_part() -> None:
    splitter = MultipartSplitter(Boundary(B.encode(), False))
    splitter.split(f"--{B}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n".encode())
    handed = 0
    for _ in range(200):
        handed += sum(len(e) for e in splitter.split(b"z" * 65536) if isinstance(e, bytes))
        assert len(splitter._buf) <= len(B) + 4
    assert handed >= 200 * 65536 - len(B) - 4


# --- options, rollout, shapes -------------------------------------------------------------------------------------


def _config(**upgrade: Any) -> dict[str, Any]:
    return make_config("http://127.0.0.1:1", routes=guarded_routes(upgrade=upgrade))


def test_defaults() -> None:
    options = UpgradeOptions()
    assert options.card_lookup == "/api/v1/cards/{card_id}"
    assert options.card_upload == "/api/v1/cards/{card_uid}/files"
    assert options.comment_upload == "/api/v1/cards/{card_uid}/comments/{comment_uid}/files"
    assert (options.upload_field, options.text_field) == ("file", "text")
    assert (options.id_cache_size, options.id_cache_ttl) == (10_000, 300.0)
    assert (options.spool_bytes, options.spool_dir, options.max_files) == (64 << 20, None, 20)
    parse_config(_config(), "test")


@pytest.mark.parametrize(("upgrade", "problem"), [
    ({"card_upload": "/api/v1/cards/{card_id}/files"},
     "card_upload must have the placeholders ['card_uid'], not ['card_id']"),
    ({"comment_upload": "/api/v1/cards/{card_uid}/files"}, "comment_upload must have the placeholders"),
    ({"card_lookup": "no-slash"}, "card_lookup: String should match pattern"),
    ({"spool_dir": "relative/dir"}, "upgrade.spool_dir: spool_dir must be an absolute path"),
    ({"spool_bytes": -1}, "spool_bytes: Input should be greater than or equal to 0"),
    ({"max_files": 0}, "max_files: Input should be greater than or equal to 1"),
    ({"id_cache_ttl": 0}, "id_cache_ttl: Input should be greater than 0"),
    ({"surprise": True}, "surprise: Extra inputs are not permitted"),
])
def test_bad_upgrade_options_stop_start_up_with_their_path(upgrade: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(**upgrade), "test")
    where = "chain[0].legacy_upload_guard.upgrade"
    assert any(where in p and problem in p for p in info.value.problems), info.value.problems


def test_the_behaviour_declares_its_bridge() -> None:
    assert LEGACY_UPLOADS.bridge == "upload_upgrade"
    loaded = parse_config({**_config(), "tenants": [
        {"name": "acme", "hosts": ["a.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01",
         "bridges": {"upload_upgrade": True}},
        {"name": "plain", "hosts": ["p.test"], "upstream": "http://127.0.0.1:1", "created": "2026-06-01"},
    ]}, "test")
    plan = loaded.rollout_plan()
    assert plan.schedule("acme", "legacy_uploads").bridge(0.0, {}) is True
    assert plan.schedule("plain", "legacy_uploads").bridge(0.0, {}) is False


@pytest.mark.parametrize(("exemption", "problem"), [
    ({"phase": "forbidden", "bridge": True}, None),
    ({"phase": "forbidden"}, "phase 'forbidden' is the last one of legacy_uploads: nothing to keep"),
    ({"phase": "forbidden", "bridge": True, "token_fingerprint": None, "header": {"name": "User-Agent",
                                                                                  "value": "x"}},
     "legacy_uploads is a security setting: exempt a client by token_fingerprint only"),
])
def test_an_exemption_may_turn_the_bridge_on_for_one_client(exemption: dict[str, Any], problem: str | None) -> None:
    entry = {"name": "uploader", "behaviour": "legacy_uploads", "until": "2099-01-01",
             "token_fingerprint": "0123456789ab", **exemption}
    entry = {k: v for k, v in entry.items() if v is not None}
    data = {**_config(), "rollout": {"exemptions": [entry]}}
    if problem is None:
        plan = parse_config(data, "test").rollout_plan()
        schedule = plan.schedule("acme", "legacy_uploads")
        headers = {"Authorization": "x"}
        assert schedule.bridge(0.0, headers) is False  # another token: the company's setting (off)
        assert schedule.phase_index(0.0, headers) == 1
        return
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test")
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_gateway_rollout_host_names_the_bridge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {"tenants": [{"name": "acme", "hosts": ["acme.test"], "upstream": "http://127.0.0.1:1",
                           "created": "2026-06-01", "bridges": {"upload_upgrade": True}}],
              "rollout": {"exemptions": [{"name": "stuck", "behaviour": "legacy_uploads", "phase": "forbidden",
                                          "until": "2027-01-01", "token_fingerprint": "0123456789ab",
                                          "bridge": False}]}}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["rollout", "--config", str(path), "--at", "2026-11-24T12:00:00Z", "--host", "acme.test"]) == 0
    out = capsys.readouterr().out
    assert "    bridge upload_upgrade: on for the company, acting in its phase forbidden (exemptions below may say " \
           "otherwise for a client)" in out
    assert "exemption 'stuck' (active): token fingerprint 0123456789ab keeps at most forbidden, bridge " \
           "upload_upgrade off until 2027-01-01" in out


def test_the_new_forms_part_head() -> None:
    head = PartHead(0, b"", "files[]", "résumé \"v2\".pdf", "application/pdf", "filename parameter")
    assert _form_head("bb", "file", head) == (
        b'--bb\r\nContent-Disposition: form-data; name="file"; filename="r_sum_ _v2_.pdf"; '
        b"filename*=UTF-8''r%C3%A9sum%C3%A9%20%22v2%22.pdf\r\nContent-Type: application/pdf\r\n\r\n")
    plain = PartHead(0, b"", "files[]", None, None, "field name 'files[]'")
    assert _form_head("bb", "file", plain) == (
        b'--bb\r\nContent-Disposition: form-data; name="file"; filename="file"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n")


def test_the_legacy_shape_of_a_restricted_file() -> None:
    record = {"id": "3f1c…", "name": "a.txt", "size": "12", "mime_type": "text/plain", "entity_type": "comment",
              "created": "t", "updated": "t", "card_uid": "cu", "author_uid": "au", "card_cover": False,
              "url": "https://files.test/signed-files/3f1c…?sig=x"}
    legacy = _legacy_file(record, 42, 7)
    assert legacy == {**record, "uid": "3f1c…", "type": 11, "size": 12, "card_id": 42, "comment_id": 7,
                      "author_id": None, "deleted": False}


def test_sandbox_faults_match_a_wildcard_segment() -> None:
    table = FaultTable()
    table.add(method="POST", path="/api/v1/cards/*/comments/*/files", query={}, status=500, delay=0, times=2)
    assert table.take("POST", "/api/v1/cards/1/comments/x/files", {}) is not None
    assert table.take("POST", "/api/v1/cards/1/comments/files", {}) is None
    assert table.take("POST", "/api/v1/cards/1/comments/x/files/y", {}) is None
    assert table.take("POST", "/api/v1/cards/2/comments/y/files", {}) is not None


def test_the_bridges_words_on_the_wire_are_its_enums_values() -> None:
    # The metric's outcome label, the header's first word and the decision come from Outcome; a file's status in the
    # partial answer and the note from FileStatus: renaming a member must not rename what operators see.
    from gateway.policies.legacy_upload_guard.upgrade import OUTCOMES, Outcome
    from gateway.policies.legacy_upload_guard.upgrade.outcomes import FileStatus

    assert OUTCOMES == ("upgraded", "partial", "failed", "rolled_back", "left_stored", "denied", "aborted", "refused",
                        "rate_limited")
    assert [o.value for o in Outcome] == list(OUTCOMES) and f"{Outcome.LEFT_STORED}" == "left_stored"
    assert [s.value for s in FileStatus] == ["uploaded", "failed", "not_sent", "rolled_back", "rollback_failed",
                                             "not_found", "unknown"]
