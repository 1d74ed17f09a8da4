"""The status page's data in pieces: the config's digest, worked out a company at a time, is the SHA-256 of the whole
shown config as canonical JSON (what /config promises); the page's choice of companies from its query."""

from __future__ import annotations

import hashlib
import json

import pytest

from gateway.app import parse_config
from gateway.ops.status import CompanyView, config_digest, shown_config
from tests.bench_testlib import load
from tests.gateway_testlib import make_config

tenants = load("tenants")


@pytest.mark.parametrize("companies", [1, 300])
def test_the_digest_is_that_of_the_whole_config_as_canonical_json(companies: int) -> None:
    data = make_config("http://svc:hunter2@127.0.0.1:1")
    data["tenants"] += [tenants.company(i, "http://127.0.0.1:2") for i in range(companies)]
    config = parse_config(data)
    whole = config.secrets.redact_data(config.model.model_dump(mode="json"))
    shown = shown_config(config)
    assert shown["tenants"] == whole["tenants"] and list(shown) == list(whole)
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert config_digest(config) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert config_digest(config) is config_digest(config)  # worked out once per config
    assert "hunter2" not in text


def test_the_page_s_query_chooses_companies() -> None:
    assert CompanyView.of({}) == CompanyView("", "", 1)
    assert CompanyView.of({"company": " acme ", "phase": "board_cards:capped", "page": "3"}) == CompanyView(
        "acme", "board_cards:capped", 3)
    for bad in ({"page": "0"}, {"page": "-1"}, {"page": "1e3"}, {"page": "1234567"}, {"phase": "capped"},
                {"phase": "a:b:c"}, {"company": "x" * 65}):
        with pytest.raises(ValueError):
            CompanyView.of(bad)
