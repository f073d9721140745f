"""`coordinator serve` settings this file owns: the event producer's (delivery timeout, queue bound) from the
command line to the store's config, the instance options in --help, and the event producer's loss reports: one line when a burst of lost events starts, one with the count when events go through again.
(Against a real broker stopped past the timeout: tests/integration/test_events_delivery_timeout.py.)"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from coordinator.app import _storage_config
from coordinator.cli import build_parser
from coordinator.commands.serve import _service_options
from coordinator.storage.config import DEFAULT_EVENT_DELIVERY_TIMEOUT_MS, StorageConfig
from coordinator.telemetry.events import _DeliveryCounts

LOGGER = "coordinator.telemetry.events"


def options_of(*argv: str):  # type: ignore[no-untyped-def]
    return _service_options(build_parser().parse_args(["serve", "--bootstrap-server", "k:9092", *argv]))


def test_delivery_timeout_and_queue_bound_reach_the_store_config() -> None:
    default = _storage_config(options_of(), "k:9092")
    assert default.event_delivery_timeout_ms == DEFAULT_EVENT_DELIVERY_TIMEOUT_MS == 30_000
    assert default.event_queue_max_messages == 100_000
    chosen = _storage_config(options_of("--event-delivery-timeout-ms", "120000", "--event-queue-max-messages",
                                        "5000"), "k:9092")
    assert (chosen.event_delivery_timeout_ms, chosen.event_queue_max_messages) == (120_000, 5_000)
    assert _storage_config(options_of("--event-delivery-timeout-ms", "0"), "k:9092").event_delivery_timeout_ms == 0


def test_environment_variables_give_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COORDINATOR_EVENT_DELIVERY_TIMEOUT_MS", "4500")
    monkeypatch.setenv("COORDINATOR_EVENT_QUEUE_MAX_MESSAGES", "77")
    config = _storage_config(options_of(), "k:9092")
    assert (config.event_delivery_timeout_ms, config.event_queue_max_messages) == (4_500, 77)


@pytest.mark.parametrize("argv, flag", [
    (("--event-delivery-timeout-ms", "-1"), "--event-delivery-timeout-ms"),
    (("--event-delivery-timeout-ms", "50"), "--event-delivery-timeout-ms"),  # not above the producer's linger
    (("--event-queue-max-messages", "0"), "--event-queue-max-messages"),
])
def test_unusable_values_are_refused_with_the_flag_named(argv: tuple[str, ...], flag: str) -> None:
    with pytest.raises(SystemExit) as refused:
        options_of(*argv)
    assert str(refused.value).startswith(f"coordinator serve: {flag}: ")


def test_serve_help_shows_each_event_and_instance_setting_with_its_environment_variable(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for flag, env in (("--event-delivery-timeout-ms MS", "COORDINATOR_EVENT_DELIVERY_TIMEOUT_MS"),
                      ("--event-queue-max-messages N", "COORDINATOR_EVENT_QUEUE_MAX_MESSAGES"),
                      ("--instance-id ID", "COORDINATOR_INSTANCE_ID"),
                      ("--instances-group GROUP", "COORDINATOR_INSTANCES_GROUP"),
                      ("--instance-session-timeout-ms MS", "COORDINATOR_INSTANCE_SESSION_TIMEOUT_MS")):
        assert flag in text and env in text, (flag, env)
    assert "several instances: Run N `coordinator serve --instance-id ID` processes" in text


def test_the_config_itself_refuses_them_too() -> None:
    with pytest.raises(ValueError, match="linger"):
        StorageConfig(bootstrap="k:9092", event_delivery_timeout_ms=20)
    assert StorageConfig(bootstrap="k:9092", event_delivery_timeout_ms=51).event_delivery_timeout_ms == 51


def test_lost_events_are_logged_once_per_burst_with_the_count_at_its_end(caplog: pytest.LogCaptureFixture) -> None:
    counts = _DeliveryCounts("__events", 3_000)
    timed_out = KafkaError(KafkaError._MSG_TIMED_OUT)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(2_500):
            counts.on_delivery(timed_out, None)
        assert counts.failures.total == 2_500
        [started] = [r for r in caplog.records if r.name == LOGGER]
        assert started.levelname == "WARNING" and "event=group_events_lost topic=__events" in started.message
        assert "delivery_timeout_ms=3000" in started.message
        counts.on_delivery(None, None)
        counts.on_delivery(None, None)  # nothing more to say while events go through
        for _ in range(3):
            counts.on_delivery(timed_out, None)  # a second burst
        counts.on_delivery(None, None)
    lines = [r.message for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 4, lines
    assert "event=group_events_lost_ended topic=__events lost=2500 " in lines[1] and "lost_total=2500" in lines[1]
    assert lines[2].startswith("event=group_events_lost ")
    assert "lost=3 " in lines[3] and "lost_total=2503" in lines[3]
    assert counts.delivered == 3 and counts.failures.total == 2_503
