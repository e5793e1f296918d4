"""Scraping a worker's HTTP endpoint in tests: probes and /metrics, parsed."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def get(port: int, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """``(status, body)`` of ``GET http://127.0.0.1:PORT/PATH``; (0, why) when nothing
    answers (not listening yet, or gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, str(exc)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> tuple[set[str], Samples]:
    """The family names and every sample of ``/metrics`` (parsed by prometheus_client:
    a body that is not valid exposition text fails here)."""
    status, body = get(port, "/metrics")
    assert status == 200, body
    families: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        families.add(family.name)
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample ``name`` whose labels include ``labels``; the sum when several match
    (e.g. one per process)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert found, f"no sample {name}{labels or ''}"
    return sum(found)
