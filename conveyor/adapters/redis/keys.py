"""Every key name Conveyor uses on Redis (:class:`Keys`), the names that may appear in
them, and stream entry ids as sequence tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.platform.errors import ConfigError
from conveyor.platform.ids import NAME, SequenceToken


def check_name(value: str, what: str) -> str:
    """Reject names that could reach into another key space (``:``, ``*``, spaces...)."""
    if not NAME.fullmatch(value):
        raise ConfigError(
            f"{what} {value!r} may only contain letters, digits, '_', '.', '-' (1-128 chars)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Keys:
    """Every Redis key Conveyor uses, derived from a validated prefix.

    Streams are per queue and shared by all apps (each app is a consumer group);
    coordination keys are per app. Namespaces and stream keys never appear in key
    names, so message metadata cannot address other keys.

    With ``cluster`` (``[redis] mode = "cluster"``) the keys one script touches together
    share a hash tag, so they share a cluster slot: a queue's lease, fencing counter and
    refused-acks count end in ``{PREFIX:q:N}`` — the stream's own name, which hashes like
    the stream key itself — and an app's three membership keys end in
    ``{PREFIX:app:APP}``. Every other key is used alone. Standalone servers keep the
    original names (a rolling upgrade would otherwise run two lease keys per queue).
    """

    prefix: str
    cluster: bool = False

    def __post_init__(self) -> None:
        check_name(self.prefix, "$.redis.prefix")

    def queue(self, queue: int) -> str:
        return f"{self.prefix}:q:{int(queue)}"

    def starts(self, queue: int) -> str:
        """The queue's delivery records (handler starts of redelivered messages, causes
        of stalls): a hash in the stream's slot."""
        return f"{self.prefix}:starts:{{{self.queue(queue)}}}"

    def _of_queue(self, name: str, queue: int) -> str:
        return f"{name}:{{{self.queue(queue)}}}" if self.cluster else f"{name}:{int(queue)}"

    def _of_app(self, group: str, name: str) -> str:
        app = self.app(group)
        return f"{app}:{name}:{{{app}}}" if self.cluster else f"{app}:{name}"

    def published(self, queue: int, batch_id: str) -> str:
        """The marker of one published batch: the queue's stream name is its hash tag
        (``{...}``), so it shares the stream's cluster slot and one script may touch both;
        stream names themselves stay as they were."""
        return f"{self.prefix}:pub:{{{self.queue(queue)}}}:{batch_id}"

    def replayed(self, group: str, queue: int, letter_id: str) -> str:
        """Cluster only: the marker of a dead letter replayed to ``queue`` (in the queue's
        slot), which makes a replay cut between its two writes safe to run again."""
        app = check_name(group, "app name")
        return f"{self.prefix}:replayed:{{{self.queue(queue)}}}:{app}:{letter_id}"

    def dead_letters(self, group: str) -> str:
        return f"{self.prefix}:dlq:{check_name(group, 'app name')}"

    def letters_stored(self, group: str, batch_id: str) -> str:
        """The marker of one stored batch of dead letters, in the letters' stream's slot
        (its name is the hash tag), as :meth:`published` is in its queue's."""
        return f"{self.prefix}:dlq-batch:{{{self.dead_letters(group)}}}:{batch_id}"

    def app(self, group: str) -> str:
        return f"{self.prefix}:app:{check_name(group, 'app name')}"

    def lease(self, group: str, queue: int) -> str:
        return self._of_queue(f"{self.app(group)}:lease", queue)

    def fence(self, group: str, queue: int) -> str:
        return self._of_queue(f"{self.app(group)}:fence", queue)

    def leases_generation(self, group: str) -> str:
        return f"{self.app(group)}:leases-generation"

    def members(self, group: str) -> str:
        return self._of_app(group, "members")

    def member_info(self, group: str) -> str:
        return self._of_app(group, "member-info")

    def members_version(self, group: str) -> str:
        return self._of_app(group, "members-version")

    def fenced_acks(self, group: str, queue: int) -> str:
        """Acknowledgements refused by fencing, a hash by stale lease value: one per app
        on a standalone server, one per app and queue (in the queue's slot) on a cluster."""
        name = f"{self.app(group)}:fenced-acks"
        return self._of_queue(name, queue) if self.cluster else name


def stream_id(text: bytes | str) -> tuple[int, int]:
    """A stream id's two parts, to compare ids as Redis orders them."""
    ms, _, seq = (text.decode() if isinstance(text, bytes) else text).partition("-")
    return int(ms), int(seq or 0)


# Stream entry ids <-> sequence tokens: an entry id ``MS-SEQ`` of queue Q is ``Q:MS-SEQ``.
def token_of(entry_id: bytes, queue: int) -> SequenceToken:
    ms, _, seq = entry_id.partition(b"-")
    return SequenceToken(queue, int(ms), int(seq or 0))


def joined_ids(tokens: Sequence[SequenceToken]) -> bytes:
    """Entry ids, space-separated: one script argument instead of one per id."""
    return b" ".join([b"%d-%d" % (t.major, t.minor) for t in tokens])


def stall_field(group: str, message_id: str) -> str:
    """The field of a recorded stall in a queue's delivery records (:meth:`Keys.starts`)."""
    return f"stall {group} {message_id}"
