"""The configuration: defaults that run locally, a file, environment overrides, and one line per
problem, from the model and from the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from compensator.config import Config, ConfigError, load
from raft_store.testing.credentials import cluster_auth, service_settings


def test_defaults_are_a_valid_local_configuration() -> None:
    config = load(None, {})
    assert config == Config()
    assert config.store.addresses == ("127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103")
    assert config.api_url == "http://127.0.0.1:8080"


def test_a_file_overlaid_by_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "compensator.toml"
    path.write_text('[store]\naddresses = ["10.0.0.1:7100", "10.0.0.2:7100"]\n[api]\nport = 9000\nworkers = 2\n')
    config = load(path, {"COMPENSATOR_API__PORT": "9001", "COMPENSATOR_QUOTA__RATE_PER_S": "50",
                         "COMPENSATOR_TELEMETRY__EXPORTER": "otlp", "UNRELATED": "x"})  # fmt: skip
    assert config.store.addresses == ("10.0.0.1:7100", "10.0.0.2:7100")
    assert (config.api.port, config.api.workers, config.quota.rate_per_s) == (9001, 2, 50)
    assert config.telemetry.exporter == "otlp"
    listed = load(None, {"COMPENSATOR_STORE__ADDRESSES": '["a:1", "b:2"]'})
    assert listed.store.addresses == ("a:1", "b:2")


def test_every_problem_is_one_line_naming_the_field(tmp_path: Path) -> None:
    environ = {"COMPENSATOR_API__PORT": "0", "COMPENSATOR_STORE__ADDRESSES": "nohost,a:1,a:1",
               "COMPENSATOR_QUOTA__HOLD_MAX_MS": "-1", "COMPENSATOR_TELEMETRY__SAMPLE_RATIO": "2"}  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        load(None, environ)
    problems = raised.value.problems
    assert problems == [
        "COMPENSATOR_STORE__ADDRESSES: store.addresses: 'nohost' is not host:port",
        "COMPENSATOR_STORE__ADDRESSES: store.addresses: an address is listed twice",
        "COMPENSATOR_API__PORT: api.port: must be in 1..65535",
        "COMPENSATOR_QUOTA__HOLD_MAX_MS: quota.hold_max_ms: must be in 0..10000",
        "COMPENSATOR_TELEMETRY__SAMPLE_RATIO: telemetry.sample_ratio: must be in 0..1",
    ]
    with pytest.raises(ConfigError, match=r"COMPENSATOR_API__PROT: no such setting \(api.prot\)"):
        load(None, {"COMPENSATOR_API__PROT": "1"})
    with pytest.raises(ConfigError, match=r"COMPENSATOR_API__WORKERS: api.workers: Expected `int`, got `str`"):
        load(None, {"COMPENSATOR_API__WORKERS": "two"})
    bad = tmp_path / "bad.toml"
    bad.write_text("[api\nport = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(bad, {})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[api]\nlisten = 1\n")
    with pytest.raises(ConfigError, match=r"unknown.toml: api.listen: no such setting"):
        load(unknown, {})
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.toml", {})


def _compensator(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compensator", *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})  # fmt: skip


def test_the_command_line_answers_bad_input_in_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[api]\nport = 0\nworkers = 0\n")
    answer = _compensator("api", "--config", str(bad))
    assert answer.returncode == 1 and answer.stdout == ""
    assert answer.stderr.splitlines() == [
        f"compensator api: {bad}: api.port: must be in 1..65535",
        f"compensator api: {bad}: api.workers: must be in 1..64",
    ]
    unreachable = _compensator("token", "list", env={**service_settings([("127.0.0.1", 9)], cluster_auth(tmp_path)),
                                                      "COMPENSATOR_STORE__DEADLINE_S": "1"})  # fmt: skip
    assert unreachable.returncode == 1 and len(unreachable.stderr.splitlines()) == 1
    assert unreachable.stderr.startswith("compensator token: error: the store at 127.0.0.1:9 did not answer")
    usage = _compensator("token", "create", "--name", "x")
    assert usage.returncode == 2
    assert usage.stderr.splitlines() == [
        "compensator token create: error: the following arguments are required: --role"
    ]
    assert "Traceback" not in usage.stderr + unreachable.stderr + answer.stderr


def test_the_kafka_section_is_checked_field_by_field() -> None:
    environ = {"COMPENSATOR_KAFKA__BOOTSTRAP_SERVERS": "broker", "COMPENSATOR_KAFKA__INGEST_PRODUCER": "Orders!",
               "COMPENSATOR_KAFKA__REJECTS_TOPIC": "compensator.requests", "COMPENSATOR_KAFKA__EVENTS_TOPIC": "a b",
               "COMPENSATOR_KAFKA__HEARTBEAT_INTERVAL_MS": "40000"}  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        load(None, environ)
    assert raised.value.problems == [
        "COMPENSATOR_KAFKA__BOOTSTRAP_SERVERS: kafka.bootstrap_servers: 'broker' is not host:port",
        "COMPENSATOR_KAFKA__EVENTS_TOPIC: kafka.events_topic: must be 1-128 of A-Z a-z 0-9 . _ -",
        "COMPENSATOR_KAFKA__REJECTS_TOPIC: kafka.rejects_topic: must differ from ingest_topic",
        "COMPENSATOR_KAFKA__INGEST_PRODUCER: kafka.ingest_producer: must be a principal name: 1-32 of a-z 0-9 _ . -"
        " starting with a letter or digit",
        "COMPENSATOR_KAFKA__HEARTBEAT_INTERVAL_MS: kafka.heartbeat_interval_ms: must be positive and under"
        " session_timeout_ms",
    ]
    kafka = load(None, {"COMPENSATOR_KAFKA__BOOTSTRAP_SERVERS": "k1:9092,k2:9092"}).kafka
    assert kafka.bootstrap_servers == ("k1:9092", "k2:9092")


def test_the_kafka_commands_answer_an_unreachable_broker_in_one_line(tmp_path: Path) -> None:
    from ledger.pg import free_tcp_port

    environ = {"COMPENSATOR_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_tcp_port()}",
               "COMPENSATOR_KAFKA__REQUEST_TIMEOUT_MS": "2000", "PATH": "/usr/bin:/bin"}  # fmt: skip
    for command in ("events-publish", "kafka-ingest"):
        done = subprocess.run([sys.executable, "-m", "compensator", command], env=environ, capture_output=True,
                              text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
        assert done.returncode == 1, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"compensator {command}: error: cannot reach the broker at 127.0.0.1:")


def test_each_downstream_declares_its_guarantee_with_the_bounds_it_needs(tmp_path: Path) -> None:
    path = tmp_path / "compensator.toml"
    path.write_text('[handlers.payment]\nbase_url = "http://10.0.0.9:443"\nguarantee = "expiry"\nclock_skew_ms = 250\n')
    config = load(path, {})
    assert (config.handlers.payment.guarantee, config.handlers.payment.clock_skew_ms) == ("expiry", 250)
    assert load(None, {}).handlers.payment.guarantee == "dedup"  # today's behaviour by default
    with pytest.raises(ConfigError) as raised:
        load(None, {"COMPENSATOR_HANDLERS__PAYMENT": '{"base_url": "http://x:1", "guarantee": "expiry",'
                                                      ' "dedup_window_s": 60}',
                    "COMPENSATOR_HANDLERS__RED_PACKET": '{"base_url": "http://x:2", "guarantee": "none"}'})  # fmt: skip
    assert raised.value.problems == [
        "COMPENSATOR_HANDLERS__PAYMENT: handlers.payment.dedup_window_s: applies to guarantee dedup only (this one is"
        " expiry)",
        "COMPENSATOR_HANDLERS__RED_PACKET: handlers.red_packet.guarantee: a list update carries its version, which the"
        " red-packet service applies only forward: that is its deduplication, so only dedup describes it",
    ]
    with pytest.raises(ConfigError, match=r"handlers.payment.guarantee: Invalid enum value 'maybe'"):
        load(None, {"COMPENSATOR_HANDLERS__PAYMENT": '{"base_url": "http://x:1", "guarantee": "maybe"}'})
    with pytest.raises(ConfigError, match=r"handlers.payment.clock_skew_ms: Expected `int` <= 60000"):
        load(None, {"COMPENSATOR_HANDLERS__PAYMENT": '{"base_url": "http://x:1", "clock_skew_ms": 600000}'})
