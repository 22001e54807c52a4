"""Errors raised by the prefix index."""


class EventRejected(ValueError):
    """An event that is out of sequence or inconsistent with the index state; nothing was changed."""


class IntegrityError(AssertionError):
    """A derived counter, list membership or ownership record disagrees with a rebuild from scratch."""
