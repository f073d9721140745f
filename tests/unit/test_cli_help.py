"""The command line as a user meets it: every sub-command's --help shows the defaults, and a wrong flag is
reported by the sub-command it was given to."""

from __future__ import annotations

import argparse

import pytest

from coordinator import cli
from coordinator.commands.serve import _one_line


def _sub_commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return {name: cli._sub_command_parser(parser, name)
            for name in ("kafka", "jaeger", "serve", "simulate", "demo", "analyze")}


@pytest.mark.parametrize("command", ["kafka", "jaeger", "serve", "simulate", "demo", "analyze"])
def test_help_names_every_option_default(command: str) -> None:
    sub = _sub_commands()[command]
    text = sub.format_help()
    for action in sub._actions:
        if action.option_strings and action.default not in (None, False, [], "", argparse.SUPPRESS):
            shown = str(action.default)
            assert "default" in (action.help or "") or f"(default: {shown})" in " ".join(text.split()), \
                f"{command} {action.option_strings[0]}: default {shown!r} not in --help"


def test_an_unknown_flag_is_reported_with_the_sub_command_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--no-such-flag"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "coordinator serve: error: unrecognized arguments: --no-such-flag" in err
    assert "--bootstrap-server" in err  # the serve usage, not the top-level one


def test_a_kafka_client_error_names_the_cluster_and_what_to_check() -> None:
    from confluent_kafka import KafkaError, KafkaException

    line = _one_line(KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for controller")),
                     "127.0.0.1:1")
    assert line.startswith("Kafka at 127.0.0.1:1 did not answer (Failed while waiting for controller)")
    assert "--bootstrap-server" in line
    assert _one_line(ValueError("a\nb")) == "ValueError: a | b"
