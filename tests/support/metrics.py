"""Reading the coordinator's Prometheus endpoint in tests."""

from __future__ import annotations

import urllib.request


def scrape(url: str) -> dict[tuple[str, str], float]:
    """Prometheus samples by (name, the reason label or ""), summed over the exporter's other labels."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, s.labels.get("reason", ""))
            samples[key] = samples.get(key, 0.0) + s.value
    return samples
