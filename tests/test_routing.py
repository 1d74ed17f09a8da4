"""The canonical path normaliser, method overrides and the route table."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.core.route import Route
from gateway.edge.method import effective_method
from gateway.edge.route_table import RouteTable
from gateway.edge.target import BadRequestTarget, normalise_target


@pytest.mark.parametrize(
    ("raw", "path", "query"),
    [
        ("/", "/", ""),
        ("/a/b", "/a/b", ""),
        ("/a/b/", "/a/b", ""),
        ("//a///b//", "/a/b", ""),
        ("/a/./b/../c", "/a/c", ""),
        ("/../../a", "/a", ""),
        ("/a/%2e%2E/b", "/b", ""),
        ("/%61%62%7E%2d%5F", "/ab~-_", ""),
        ("/a/%c3%a9", "/a/%C3%A9", ""),
        ("/a/%20b", "/a/%20b", ""),
        ("/a/.b/c.d", "/a/.b/c.d", ""),
        ("/.well-known/x", "/.well-known/x", ""),
        ("/x?y=1&z=%2F", "/x", "y=1&z=%2F"),
        ("/x/?", "/x", ""),
        ("http://acme.test/a//b?q", "/a/b", "q"),
        ("http://acme.test?q", "/", "q"),
    ],
)
def test_canonical_paths(raw: str, path: str, query: str) -> None:
    target = normalise_target(raw)
    assert (target.path, target.query) == (path, query)


@pytest.mark.parametrize(
    "raw",
    [
        "/a%2fb", "/a%2Fb", "/a%5Cb", "/a\\b", "/a%00", "/a;b", "/a/b;jsessionid=1", "/a%3bb", "/a%", "/a%4",
        "/a%g0", "/a%0a", "/a%7f", "/a b", "/a\"b", "/a<b", "/a#frag", "/é", "*", "a/b", "ftp://x/a",
        "http:///a", "http://user@acme.test/a", "/x?a b",
        # a segment ending in a dot or a space: trimmed by some upstreams into another route
        "/a.", "/a/b./c", "/a%2e", "/a%2E/", "/a%20", "/a/b%20/c", "/a/..%2e/b", "/a/...", "/a/b.%20",
    ],
)
def test_unsafe_targets_are_refused(raw: str) -> None:
    with pytest.raises(BadRequestTarget):
        normalise_target(raw)


def _headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


@pytest.mark.parametrize(
    ("method", "headers", "query", "expected"),
    [
        ("POST", (), "", "POST"),
        ("POST", (("X-HTTP-Method-Override", "put"),), "", "PUT"),
        ("POST", (("X-Method-Override", "PATCH"),), "", "PATCH"),
        ("POST", (("x-http-method", " Put "),), "", "PUT"),
        ("POST", (), "_method=PUT", "PUT"),
        ("POST", (), "%5Fmethod=put", "PUT"),
        ("POST", (), "_METHOD=put&x=1", "PUT"),
        ("POST", (("X-HTTP-Method-Override", "PUT"),), "_method=put", "PUT"),
        ("GET", (), "method=PUT", "GET"),
        ("POST", (), "a=1;_method=PUT", "PUT"),
        ("POST", (), "a=1;%5fmethod=patch;b=2", "PATCH"),
    ],
)
def test_effective_method(method: str, headers: tuple[tuple[str, str], ...], query: str, expected: str) -> None:
    assert effective_method(method, _headers(*headers), query)[0] == expected


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ((("X-HTTP-Method-Override", "PUT"), ("X-Method-Override", "DELETE")), ""),
        ((("X-HTTP-Method-Override", "PUT"),), "_method=POST"),
        ((), "_method=PUT&_method=GET"),
        ((), "_method=PUT;_method=GET"),
        ((("X-HTTP-Method-Override", "PUT"),), "a=1;_method=POST"),
        ((("X-HTTP-Method-Override", "PU T"),), ""),
    ],
)
def test_conflicting_or_invalid_overrides_are_refused(headers, query: str) -> None:
    with pytest.raises(BadRequestTarget) as err:
        effective_method("POST", _headers(*headers), query)
    assert err.value.code == "AMBIGUOUS_METHOD"


def test_route_table_first_match_and_catch_all() -> None:
    board = Route.build("board", ["GET", "HEAD"], ["/boards/{board_id}", "/spaces/{space_id}/boards/{board_id}"],
                        ["/api/v1", "/api/latest"])
    upload = Route.build("upload", ["PUT"], ["/cards/{card_id}/files"], ["/api/v1", "/api/latest"])
    any_method = Route.build("anything", None, ["/cards/{card_id}/files"], ["/api/v1"])
    table = RouteTable([board, upload, any_method], Route.build("catch_all", None, (), ()))
    assert table.match("GET", "/api/latest/boards/7") == (board, {"board_id": "7"})
    assert table.match("HEAD", "/API/V1/spaces/2/BOARDS/9") == (board, {"space_id": "2", "board_id": "9"})
    assert table.match("PUT", "/api/latest/cards/5/files") == (upload, {"card_id": "5"})
    assert table.match("POST", "/api/v1/cards/5/files") == (any_method, {"card_id": "5"})
    route, params = table.match("POST", "/api/latest/cards/5/files")
    assert route.name == "catch_all" and params == {}
    assert table.match("GET", "/api/v1/boards/7/extra")[0].name == "catch_all"
    assert table.match("GET", "/api/v2/boards/7")[0].name == "catch_all"


UID = "4f2e42af-43d7-4092-a74f-f556bf0f95d0"


def test_a_parameters_shape_tells_an_earlier_id_from_a_uid() -> None:
    """``{name:not_uuid}`` and ``{name:uuid}``: the restricted routes' paths with an earlier id are another route, and
    each path is matched once per request (the table keeps each route's result)."""
    legacy = Route.build("legacy_id", ["POST"], ["/cards/{card_id:not_uuid}/files"], ["/api/v1"], guarded=True)
    comments = Route.build("legacy_id_comment", ["POST"], ["/cards/{card_id:not_uuid}/comments/{comment_uid:uuid}/files",
                                                           "/cards/{card_id:not_uuid}/comments/{comment_id}/files",
                                                           "/cards/{card_uid}/comments/{comment_id:not_uuid}/files"],
                           ["/api/v1"], guarded=True)
    upload = Route.build("upload", ["POST"], ["/cards/{card_uid}/files", "/cards/{card_uid}/comments/{c}/files"],
                         ["/api/v1"])
    table = RouteTable([legacy, comments, upload], Route.build("catch_all", None, (), ()))
    assert table.match("POST", "/api/v1/cards/42/files") == (legacy, {"card_id": "42"})
    for spelled in (UID, UID.upper(), UID[:9] + UID[9:].upper()):
        assert table.match("POST", f"/api/v1/cards/{spelled}/files") == (upload, {"card_uid": spelled})
    for not_a_uid in (UID.replace("-", ""), UID + "0", "0" + UID, UID[:-1] + "g", "{" + UID + "}", "x"):
        assert table.match("POST", f"/api/v1/cards/{not_a_uid}/files") == (legacy, {"card_id": not_a_uid})
    assert table.match("POST", f"/api/v1/cards/7/comments/{UID}/files") == (comments, {"card_id": "7",
                                                                                       "comment_uid": UID})
    assert table.match("POST", "/api/v1/cards/7/comments/8/files") == (comments, {"card_id": "7", "comment_id": "8"})
    assert table.match("POST", f"/api/v1/cards/{UID}/comments/8/files") == (comments, {"card_uid": UID,
                                                                                      "comment_id": "8"})
    assert table.match("POST", f"/api/v1/cards/{UID}/comments/{UID}/files")[0] is upload
    assert comments.params == {"card_id", "card_uid", "comment_id", "comment_uid"}
    assert legacy.templates == ("/api/v1/cards/{card_id:not_uuid}/files",)


def test_a_route_path_names_only_known_shapes() -> None:
    from gateway.config import ConfigError, parse_model

    route = {"name": "r", "paths": ["/cards/{card_id:number}/files"]}
    with pytest.raises(ConfigError, match=r"routes\.0\.paths|routes\[0\]\.paths"):
        parse_model({"tenants": [{"name": "t", "hosts": ["h"], "upstream": "http://127.0.0.1:1"}], "routes": [route]})
    route["paths"] = ["/cards/{card_id:not_uuid}/files"]
    parse_model({"tenants": [{"name": "t", "hosts": ["h"], "upstream": "http://127.0.0.1:1"}], "routes": [route]})


def test_an_override_reaches_a_guarded_route_only_where_its_paths_and_the_table_order_allow() -> None:
    legacy = Route.build("legacy", ["PUT"], ["/cards/{card_id}/files"], ["/api/v1"], guarded=True)
    shadow = Route.build("shadow", ["PATCH"], ["/cards/shadowed/files"], ["/api/v1"])
    anything = Route.build("anything", None, ["/anything/{id}"], ["/api/v1"], guarded=True)
    upload = Route.build("upload", ["POST"], ["/cards/{card_uid}/files"], ["/api/v1"])
    guarded_after = Route.build("after", ["PATCH"], ["/cards/{card_id}/files"], ["/api/v1"], guarded=True)
    table = RouteTable([shadow, legacy, anything, upload, guarded_after], Route.build("catch_all", None, (), ()))
    assert table.lookup("/api/v1/cards/7/files").override_reaches_guard(upload)  # PUT: legacy
    assert not table.lookup("/api/v1/cards/7/other").override_reaches_guard(upload)
    assert table.lookup("/api/v1/anything/3").override_reaches_guard(table.catch_all)  # any method: PUT stands for them
    assert not table.lookup("/api/v1/anything").override_reaches_guard(legacy)
    # PATCH on this path is taken by the unguarded route listed first; PUT still reaches legacy.
    assert table.lookup("/api/v1/cards/shadowed/files").override_reaches_guard(upload)
    # Where an unguarded route listed first takes every method that would reach the guarded one, none does.
    shadowed = RouteTable([shadow, upload, guarded_after], Route.build("catch_all", None, (), ()))
    assert shadowed.lookup("/api/v1/cards/7/files").override_reaches_guard(upload)
    assert not shadowed.lookup("/api/v1/cards/shadowed/files").override_reaches_guard(upload)
    unguarded = RouteTable([shadow, upload], Route.build("catch_all", None, (), ()))
    assert not unguarded.lookup("/api/v1/cards/7/files").override_reaches_guard(upload)
