"""What a publish whose sends did not all succeed raises: one rule for every backend.

A publish is cut into sends — per queue by :meth:`Client.publish_batch`, per script
call by the Redis adapter, per record batch by the Kafka adapter — and each send is
stored whole or not at all. :func:`publish_failure` turns the sends' outcomes into the
one error the caller sees:

- nothing stored, nothing in doubt: the first send's error (publishing the whole batch
  again doubles nothing);
- nothing known stored, some in doubt: :class:`PublishUncertain` with those ids;
- anything else: :class:`PartialPublishError`, every message's fate by id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from conveyor.platform.errors import PartialPublishError, PublishUncertain
from conveyor.platform.ids import SequenceToken


def publish_failure(what: str, ids: Sequence[str], published: Mapping[str, SequenceToken],
                    failures: Sequence[tuple[Sequence[str], BaseException]]) -> BaseException:
    """The error for a publish of ``ids`` (in the caller's order) of which ``published``
    were stored and each of ``failures`` (the ids of one send, its error) was not, or may
    not have been. ``what`` starts the message ("publish_batch")."""
    if len(failures) == 1 and not published and len(failures[0][0]) == len(ids):
        return failures[0][1]  # one send held them all: its own error says it
    stored = dict(published)
    failed: dict[str, BaseException] = {}
    uncertain: list[str] = []
    for sent, error in failures:
        if isinstance(error, PartialPublishError):
            stored.update(error.published)
            failed.update(error.failed)
            uncertain += error.uncertain
        elif isinstance(error, PublishUncertain):
            uncertain += sent
        else:
            failed.update((ident, error) for ident in sent)
    first = failures[0][1]
    if not stored and not uncertain:
        return first
    if not stored and not failed:
        return PublishUncertain(
            f"{what}: none of the {len(ids)} messages is known to be stored; they may or "
            f"may not have been written ({first}); their ids are in .message_ids",
            tuple(uncertain))
    return PartialPublishError(
        f"{what}: {len(stored)} of the {len(ids)} messages were stored, {len(failed)} were "
        f"not and {len(uncertain)} may or may not have been (first error: {first}); ids in "
        ".published, .failed and .uncertain: publish .not_published(items) again",
        ids, stored, failed, uncertain)
