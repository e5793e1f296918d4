"""A refused SASL login reads "authentication failed", not aiokafka's ``KeyError: 'v'``.

aiokafka's SCRAM code expects the server's final message to carry its signature
(``v=...``); a broker that refuses the login sends an error (``e=...``) instead, and the
client fails with ``KeyError: 'v'``. The exception here is produced by aiokafka's own
authenticator, fed what such a broker sends. (tests/integration/kafka/test_kafka_auth.py
does the same against a real broker that requires authentication.)
"""

from __future__ import annotations

import base64

import pytest
from aiokafka import errors as kerrors
from aiokafka.conn import ScramAuthenticator

from conveyor.adapters.kafka.connection import CLIENT_ERRORS, broker_error, is_login_failure
from conveyor.platform.errors import BrokerConnectionError, BrokerError

PASSWORD = "s3cret-Pa55word"


def refused_scram_login() -> BaseException:
    auth = ScramAuthenticator(loop=None, sasl_plain_password=PASSWORD,
                              sasl_plain_username="alice", sasl_mechanism="SCRAM-SHA-256")
    steps = auth.authenticator_scram()
    client_first, _ = next(steps)
    nonce = client_first.decode().split("r=", 1)[1]
    salt = base64.b64encode(b"salt").decode()
    steps.send(f"r={nonce}server,s={salt},i=4096".encode())
    try:
        steps.send(b"e=invalid-proof")  # what a broker sends for a wrong password
    except BaseException as exc:  # the exception under test
        return exc
    raise AssertionError("aiokafka accepted a refused login")


def test_aiokafka_reports_a_refused_scram_login_as_key_error_v() -> None:
    exc = refused_scram_login()
    assert isinstance(exc, KeyError) and exc.args == ("v",)
    assert isinstance(exc, CLIENT_ERRORS), "the adapters' start sites must catch it"


def test_a_refused_scram_login_says_authentication_failed_without_the_password() -> None:
    exc = refused_scram_login()
    assert is_login_failure(exc)
    error = broker_error("connecting the producer", exc)
    assert type(error) is BrokerError, "not retried as an outage"
    text = str(error)
    assert "kafka: connecting the producer failed: authentication failed" in text
    assert "$.kafka.sasl_username" in text and PASSWORD not in text and "\n" not in text


@pytest.mark.parametrize("exc", [
    kerrors.SaslAuthenticationFailed("Authentication failed: Invalid username or password"),
    kerrors.AuthenticationFailedError(),
    kerrors.AuthenticationMethodNotSupported("broker does not support PLAIN"),
])
def test_aiokafka_login_errors_say_authentication_failed(exc: BaseException) -> None:
    error = broker_error("joining group 'shop'", exc)
    assert type(error) is BrokerError and "authentication failed" in str(error)


def test_other_key_and_value_errors_are_not_taken_for_a_login_failure() -> None:
    for exc in (KeyError("v"), ValueError("Server sent wrong signature!")):
        assert not is_login_failure(exc), "raised outside aiokafka's SCRAM code"
        with pytest.raises(type(exc)):
            broker_error("connecting", exc)


def test_connection_errors_stay_retriable() -> None:
    error = broker_error("connecting", kerrors.KafkaConnectionError("Unable to bootstrap"))
    assert isinstance(error, BrokerConnectionError)
    assert "authentication" not in str(error)


def test_a_batch_in_a_codec_this_install_lacks_names_the_package_to_install() -> None:
    # Such a batch (lz4 from a Java producer, with no cramjam here) failed every pull of
    # its queue with aiokafka's "Libraries for lz4 compression codec not found" alone.
    exc = kerrors.UnsupportedCodecError("Libraries for lz4 compression codec not found")
    assert str(broker_error("fetching queue 2", exc)) == (
        "kafka: fetching queue 2 failed: UnsupportedCodecError: Libraries for lz4 "
        "compression codec not found (a producer compressed the batch, e.g. a Java "
        "client's compression.type): install the codecs with pip install "
        "'aiokafka[lz4,snappy,zstd]'; the queue waits for them, nothing is skipped")
