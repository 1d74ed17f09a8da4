"""In-memory entities of one sandbox instance and the changes the routes make."""

from __future__ import annotations

import bisect
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

__all__ = [
    "Board",
    "Card",
    "CardFile",
    "Column",
    "Comment",
    "CustomProperty",
    "EntityType",
    "Lane",
    "LegacyFile",
    "RestrictedFile",
    "Space",
    "Store",
    "StoredContent",
    "User",
    "utc_now",
]

EntityType = Literal["card", "comment", "custom_property"]


def utc_now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


@dataclass(slots=True)
class StoredContent:
    """What the sandbox kept of an uploaded body: always its size and hash,
    the bytes only when small enough to retain."""

    size: int
    sha256: str
    data: bytes | None


@dataclass(slots=True)
class User:
    id: int
    uid: str
    full_name: str


@dataclass(slots=True)
class Space:
    id: int
    uid: str
    title: str
    board_ids: list[int]


@dataclass(slots=True)
class Column:
    id: int
    uid: str
    board_id: int
    title: str
    sort_order: float
    type: int
    wip_limit: int | None


@dataclass(slots=True)
class Lane:
    id: int
    uid: str
    board_id: int
    title: str
    sort_order: float


@dataclass(slots=True)
class CustomProperty:
    id: int
    uid: str
    name: str
    type: str


@dataclass(slots=True)
class Board:
    id: int
    uid: str
    space_id: int
    title: str
    created: datetime
    updated: datetime
    description: str | None
    external_id: str | None
    email_key: str
    default_card_type_id: int
    default_tags: str | None
    cell_wip_limits: list[dict[str, int]] | None
    move_parents_to_done: bool
    first_image_is_cover: bool
    reset_lane_spent_time: bool
    backward_moves_enabled: bool
    hide_done_policies: bool
    hide_done_policies_in_done_column: bool
    automove_cards: bool
    auto_assign_enabled: bool
    card_property_ids: list[int]
    private: bool
    columns: list[Column] = field(default_factory=list)
    lanes: list[Lane] = field(default_factory=list)


@dataclass(slots=True)
class Card:
    id: int
    uid: str
    board_id: int
    column_id: int
    lane_id: int
    title: str
    description: str | None
    sort_order: float
    size: int
    owner_id: int
    created: datetime
    updated: datetime


@dataclass(slots=True)
class Comment:
    id: int
    uid: str
    card_id: int
    text: str
    author_id: int
    created: datetime
    updated: datetime


@dataclass(slots=True)
class LegacyFile:
    """An earlier file: numeric id, permanent public link, no protection.

    ``external_url`` is set for files attached by URL; they have no content.
    """

    id: int
    uid: str
    card_id: int
    comment_id: int | None
    name: str
    mime_type: str
    size: int
    content: StoredContent | None
    external_url: str | None
    author_id: int
    created: datetime
    updated: datetime
    card_cover: bool = False
    type: int = 1


@dataclass(slots=True)
class RestrictedFile:
    """A restricted access file: UUID id, reachable only through signed links."""

    id: str
    card_id: int
    entity_type: EntityType
    comment_id: int | None
    property_id: int | None
    name: str
    mime_type: str
    content: StoredContent
    author_id: int
    created: datetime
    updated: datetime
    card_cover: bool = False


CardFile = LegacyFile | RestrictedFile


class Store:
    """All entities, indexed the ways the routes look them up.

    Uids come from a seeded generator, so two stores built with the same seed
    hand out the same uids in the same order.
    """

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.users: dict[int, User] = {}
        self.spaces: dict[int, Space] = {}
        self.boards: dict[int, Board] = {}
        self.cards: dict[int, Card] = {}
        self.comments: dict[int, Comment] = {}
        self.properties: dict[int, CustomProperty] = {}
        self.legacy_files: dict[int, LegacyFile] = {}
        self.restricted_files: dict[str, RestrictedFile] = {}
        self._card_uids: dict[str, int] = {}
        self._comment_uids: dict[str, int] = {}
        self._property_uids: dict[str, int] = {}
        self._card_files: dict[int, list[CardFile]] = {}
        self._card_comments: dict[int, list[Comment]] = {}
        self._board_cards: dict[int, list[Card]] = {}
        self._next_card_id = 1
        self._next_comment_id = 1
        self._next_legacy_file_id = 1
        self.default_author_id = 1

    # -- identifiers -------------------------------------------------------

    def new_uid(self, rng: random.Random | None = None) -> str:
        """A uid from the store's generator, or from ``rng`` when given (so
        a part of the data can be seeded without shifting later uids)."""
        return str(uuid.UUID(int=(self._rng if rng is None else rng).getrandbits(128), version=4))

    def new_card_id(self) -> int:
        return self._next_card_id

    def rng(self) -> random.Random:
        return self._rng

    # -- seeding helpers ---------------------------------------------------

    def add_user(self, user: User) -> None:
        self.users[user.id] = user

    def add_space(self, space: Space) -> None:
        self.spaces[space.id] = space

    def add_board(self, board: Board) -> None:
        self.boards[board.id] = board
        self._board_cards.setdefault(board.id, [])

    def add_property(self, prop: CustomProperty) -> None:
        self.properties[prop.id] = prop
        self._property_uids[prop.uid] = prop.id

    def add_card(self, card: Card) -> None:
        self.cards[card.id] = card
        self._card_uids[card.uid] = card.id
        self._card_files.setdefault(card.id, [])
        self._next_card_id = max(self._next_card_id, card.id + 1)
        cards = self._board_cards.setdefault(card.board_id, [])
        # Board order is (sort_order, id). Appending in order is the common
        # case and must stay O(1): boards of 10,000 cards are built this way.
        if not cards or _board_order(cards[-1]) < _board_order(card):
            cards.append(card)
        else:
            bisect.insort(cards, card, key=_board_order)

    # -- lookups -----------------------------------------------------------

    def user(self, user_id: int) -> User:
        return self.users[user_id]

    def board_cards(self, board_id: int) -> list[Card]:
        return self._board_cards.get(board_id, [])

    def all_cards(self) -> list[Card]:
        return [card for board_id in sorted(self._board_cards) for card in self._board_cards[board_id]]

    def card_by_ref(self, ref: str) -> Card | None:
        """Find a card by numeric id or by uid; both spellings reach the same card."""
        if ref.isdigit():
            return self.cards.get(int(ref))
        card_id = self._card_uids.get(ref.lower())
        return None if card_id is None else self.cards[card_id]

    def comment_by_ref(self, card: Card, ref: str) -> Comment | None:
        if ref.isdigit():
            comment = self.comments.get(int(ref))
        else:
            comment_id = self._comment_uids.get(ref.lower())
            comment = None if comment_id is None else self.comments[comment_id]
        return comment if comment is not None and comment.card_id == card.id else None

    def property_by_ref(self, ref: str) -> CustomProperty | None:
        if ref.isdigit():
            return self.properties.get(int(ref))
        prop_id = self._property_uids.get(ref.lower())
        return None if prop_id is None else self.properties[prop_id]

    def card_comments(self, card: Card) -> list[Comment]:
        return list(self._card_comments.get(card.id, []))

    def card_files(self, card: Card) -> list[CardFile]:
        return list(self._card_files.get(card.id, []))

    def comment_files(self, comment: Comment) -> list[CardFile]:
        return [
            f
            for f in self._card_files.get(comment.card_id, [])
            if f.comment_id == comment.id
            and (isinstance(f, LegacyFile) or f.entity_type == "comment")
        ]

    def property_files(self, card: Card, prop: CustomProperty) -> list[RestrictedFile]:
        return [
            f
            for f in self._card_files.get(card.id, [])
            if isinstance(f, RestrictedFile) and f.property_id == prop.id
        ]

    # -- changes -----------------------------------------------------------

    def touch(self, card: Card, when: datetime) -> None:
        card.updated = when

    def add_comment(self, card: Card, text: str, author_id: int, when: datetime) -> Comment:
        comment = Comment(
            id=self._next_comment_id,
            uid=self.new_uid(),
            card_id=card.id,
            text=text,
            author_id=author_id,
            created=when,
            updated=when,
        )
        self._next_comment_id += 1
        self.comments[comment.id] = comment
        self._card_comments.setdefault(card.id, []).append(comment)
        self._comment_uids[comment.uid] = comment.id
        self.touch(card, when)
        return comment

    def add_legacy_file(
        self,
        card: Card,
        *,
        name: str,
        mime_type: str,
        content: StoredContent | None,
        external_url: str | None = None,
        size: int | None = None,
        comment: Comment | None = None,
        author_id: int,
        when: datetime,
        file_type: int = 1,
    ) -> LegacyFile:
        record = LegacyFile(
            id=self._next_legacy_file_id,
            uid=self.new_uid(),
            card_id=card.id,
            comment_id=None if comment is None else comment.id,
            name=name,
            mime_type=mime_type,
            size=content.size if content is not None else (size or 0),
            content=content,
            external_url=external_url,
            author_id=author_id,
            created=when,
            updated=when,
            type=file_type,
        )
        self._next_legacy_file_id += 1
        self.legacy_files[record.id] = record
        self._card_files[card.id].append(record)
        self.touch(card, when)
        return record

    def add_restricted_file(
        self,
        card: Card,
        *,
        entity_type: EntityType,
        name: str,
        mime_type: str,
        content: StoredContent,
        comment: Comment | None = None,
        prop: CustomProperty | None = None,
        author_id: int,
        when: datetime,
    ) -> RestrictedFile:
        record = RestrictedFile(
            id=self.new_uid(),
            card_id=card.id,
            entity_type=entity_type,
            comment_id=None if comment is None else comment.id,
            property_id=None if prop is None else prop.id,
            name=name,
            mime_type=mime_type,
            content=content,
            author_id=author_id,
            created=when,
            updated=when,
        )
        self.restricted_files[record.id] = record
        self._card_files[card.id].append(record)
        self.touch(card, when)
        return record

    def set_card_cover(self, card: Card, target: CardFile, cover: bool, when: datetime) -> None:
        """A card has at most one cover, so choosing one clears the others."""
        if cover:
            for other in self._card_files.get(card.id, []):
                if other is not target and other.card_cover:
                    other.card_cover = False
                    other.updated = when
        target.card_cover = cover
        target.updated = when
        self.touch(card, when)

    def rename_file(self, card: Card, target: CardFile, name: str, when: datetime) -> None:
        target.name = name
        target.updated = when
        self.touch(card, when)

    def insert_cards(self, board: Board, *, at_start: bool, count: int, when: datetime) -> list[Card]:
        """``count`` new cards before the board's first card or after its
        last, in id order among themselves; they get the board's first
        column and lane."""
        existing = self.board_cards(board.id)
        if at_start:
            first_order = (existing[0].sort_order if existing else 1.0) - count
        else:
            first_order = (existing[-1].sort_order if existing else 0.0) + 1
        inserted: list[Card] = []
        for n in range(count):
            card_id = self.new_card_id()
            card = Card(
                id=card_id,
                uid=self.new_uid(),
                board_id=board.id,
                column_id=board.columns[0].id,
                lane_id=board.lanes[0].id,
                title=f"Inserted card #{card_id}",
                description=None,
                sort_order=first_order + n,
                size=1,
                owner_id=self.default_author_id,
                created=when,
                updated=when,
            )
            self.add_card(card)
            inserted.append(card)
        return inserted

    def delete_file(self, card: Card, target: CardFile, when: datetime) -> None:
        self._card_files[card.id].remove(target)
        if isinstance(target, LegacyFile):
            del self.legacy_files[target.id]
        else:
            del self.restricted_files[target.id]
        self.touch(card, when)


def _board_order(card: Card) -> tuple[float, int]:
    return (card.sort_order, card.id)
