"""Host names as the resolver takes them: checked where a config or a command names one."""

from __future__ import annotations

from conveyor.platform.errors import ConfigError


def host_problem(host: str) -> str | None:
    """Why no resolver takes ``host``, else None.

    ``socket.getaddrinfo`` encodes a name with Python's IDNA codec, which raises
    ``UnicodeError``, not the ``OSError`` of a name that resolves to nothing, for a
    dot-separated part that is empty or longer than 63 characters (DNS's limit): a
    traceback, from wherever the name was first resolved."""
    try:
        host.encode("idna")
    except UnicodeError:
        return (f"{host!r:.100} is no host name: a dot-separated part is empty or longer "
                "than 63 characters")
    return None


def check_host(host: str, field: str) -> None:
    """Refuse ``host`` (:class:`ConfigError` naming ``field``) when no resolver takes it."""
    problem = host_problem(host)
    if problem is not None:
        raise ConfigError(f"{field}: {problem}")
