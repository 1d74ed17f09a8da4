"""The default seed yields the ids and uids documented in sandbox/README.md."""

from __future__ import annotations

from pathlib import Path

from sandbox.seed import build_store
from sandbox.settings import SandboxSettings

README = Path(__file__).resolve().parents[2] / "sandbox" / "README.md"
DOCUMENTED = {
    "card 1": "4f2e42af-43d7-4092-a74f-f556bf0f95d0",
    "comment 1": "d576cdda-bf38-432a-af7b-96a128407286",
    "property 1": "7949522d-eb69-4eb0-a817-955f7166447f",
    "plan.pdf": "26fffd83-2d67-4dba-b664-764d3174f640",
    "Отчёт ✓ 日本.txt": "bed770b7-4c54-4476-a041-0de451e392bf",
    "notes.txt": "841f708e-fa19-44b3-8181-2f04e7340d28",
    "scan.png": "9567bb82-40df-4313-829e-47ac6911b7f3",
}


def test_default_seed_matches_documented_uids() -> None:
    store = build_store(SandboxSettings().seed)
    card = store.cards[1]
    actual = {
        "card 1": card.uid,
        "comment 1": store.comments[1].uid,
        "property 1": store.properties[1].uid,
        **{f.name: f.id for f in store.card_files(card) if isinstance(f.id, str)},
    }
    assert actual == DOCUMENTED
    readme = README.read_text(encoding="utf-8")
    for uid in DOCUMENTED.values():
        assert uid in readme


def test_seed_shape() -> None:
    store = build_store(1)
    assert [c.id for c in store.board_cards(1)] == list(range(1, 251))
    assert store.board_cards(2) == [] and store.board_cards(3) == []
    assert store.boards[3].private and not store.boards[1].private
    assert sorted(store.spaces[1].board_ids) == [1, 2, 3]
