"""TLS against Mosquitto's TLS listener, with the blocking and the asyncio client, on CPython and on
the MicroPython unix port (each test runs on both; fixture `tls_broker` in conftest.py).

What each runtime does, found here and asserted below:
- the CA: CPython's load_verify_locations takes DER bytes or PEM text as cadata; MicroPython's
  mbedtls build has no PEM parser, so it takes DER only (PEM -> ValueError "invalid cert");
- verification: CPython's SSLContext(PROTOCOL_TLS_CLIENT) verifies by default; MicroPython's starts
  with verify_mode CERT_NONE and verifies nothing, CA loaded or not, until verify_mode is set to
  CERT_REQUIRED;
- host names: both check server_hostname against the certificate (MicroPython: mbedtls 3.6, which
  matches IP address entries too); a name the certificate does not carry is refused;
- errors: CPython raises ssl.SSLCertVerificationError (an OSError); MicroPython raises ValueError
  with mbedtls' text from the blocking handshake, and the asyncio client reports OSError.
"""

import ssl
import asyncio

from check import MICROPYTHON, raises
from pump import until, collect
from tern import aio, tls
from tern.client import Client

T = 5  # seconds: the bound on every wait here
# what each runtime says when the chain or the name does not verify
BAD_CA = "not correctly signed by the trusted CA" if MICROPYTHON else "certificate verify failed"
BAD_NAME = "Common Name (CN) does not match" if MICROPYTHON else "Hostname mismatch"


def cert(b, name):
    return b["certs"] + "/" + name


def context(ca_path, verify=True):
    """tern.tls.context (verifying) or, verify=False, a bare SSLContext at its runtime's default
    with the CA in the DER file ca_path loaded."""
    if verify:
        return tls.context(ca=ca_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    with open(ca_path, "rb") as f:
        ctx.load_verify_locations(cadata=f.read())
    return ctx


def tls_client(b, name, ctx, **kw):
    return Client(name, server=b["host"], port=b["tls_port"], ssl=ctx, connect_timeout=T, **kw)


def refused(e, what):
    assert what in str(e), "%s: %r does not say %r" % (type(e).__name__, e, what)


def test_each_runtime_takes_the_ca_in_its_format(tls_broker):
    with open(cert(tls_broker, "ca.pem")) as f:
        pem = f.read()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if MICROPYTHON:
        refused(raises(ValueError, ctx.load_verify_locations, cadata=pem), "invalid cert")
        refused(raises(ValueError, ctx.load_verify_locations, cadata=pem.encode()), "invalid cert")
        assert ctx.verify_mode == ssl.CERT_NONE
    else:
        ctx.load_verify_locations(cadata=pem)
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    # DER works on both (context() loads it); the round trip tests below connect with it


def test_tls_context_takes_pem_files_and_bundles_on_both_runtimes(tls_broker):
    # What users have: the CA as a PEM file, maybe in a bundle with other CAs.
    ctx = tls.context(ca=cert(tls_broker, "ca.pem"))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    c = tls_client(tls_broker, "tls-pem", ctx, reconnect=False)
    c.connect()
    assert c.connected
    c.disconnect()
    with open(cert(tls_broker, "ca.pem"), "rb") as f:
        pem = f.read()
    with open(cert(tls_broker, "other_ca.der"), "rb") as f:
        other = f.read()
    assert tls.der_certs(other) == [other]
    from binascii import b2a_base64

    other_pem = b"-----BEGIN CERTIFICATE-----\n" + b2a_base64(other) + b"-----END CERTIFICATE-----\n"
    bundle = tls.context(cadata=other_pem + pem)  # the broker's CA second in the bundle
    c = tls_client(tls_broker, "tls-bundle", bundle, reconnect=False)
    c.connect()
    c.disconnect()
    refused(raises((OSError, ValueError), tls_client(tls_broker, "tls-other", tls.context(cadata=other_pem),
                                                     reconnect=False).connect), BAD_CA)
    refused(raises(ValueError, tls.der_certs, b"-----BEGIN PRIVATE KEY-----\nAAAA\n"), "no CERTIFICATE block")
    refused(raises(ValueError, tls.der_certs, pem[: pem.find(b"-----END")]), "no END line")


def test_micropython_context_left_at_its_default_does_not_verify(tls_broker):
    # Why context() and the firmware set verify_mode: with the default, MicroPython accepts a server
    # that a CA it never saw signed. CPython refuses it.
    c = tls_client(tls_broker, "tls-default-mode", context(cert(tls_broker, "other_ca.der"), verify=False),
                   reconnect=False)
    if MICROPYTHON:
        c.connect()
        assert c.connected
        c.disconnect()
    else:
        refused(raises(OSError, c.connect), BAD_CA)


def test_blocking_client_qos1_round_trip_over_verified_tls(tls_broker):
    got = []
    # (messages up to 1.9 KB, several TLS records each: over a board's default 1 KiB receive buffer)
    c = tls_client(tls_broker, "tls-blocking", context(cert(tls_broker, "ca.der")), version=5, rx_size=4096)
    c.connect()
    assert c.subscribe("tls/blocking/#", 1, handler=collect(got)) == [1]
    sent = [("tls/blocking/%d" % i, b"reading %d " % i + b"x" * (i * 97), 1, False) for i in range(20)]
    for topic, payload, q, _ in sent:
        assert c.publish(topic, payload, qos=q) > 0
    c.wait_all(T)
    until([c], lambda: len(got) >= 20, T * 1000, "20 QoS 1 messages back over TLS")
    assert got == sent, got[:3]
    c.disconnect()


def test_aio_client_qos1_round_trip_over_verified_tls(tls_broker):
    async def main():
        c = aio.Client("tls-aio", server=tls_broker["host"], port=tls_broker["tls_port"],
                       ssl=context(cert(tls_broker, "ca.der")), version=5, connect_timeout=T)
        await c.connect()
        assert await c.subscribe("tls/aio/#", 1) == [1]
        it = c.messages()
        for i in range(5):
            await c.publish("tls/aio/%d" % i, b"aio %d" % i, qos=1)
        got = []
        for _ in range(5):
            m = await asyncio.wait_for(it.__anext__(), T)
            got.append((m.topic, m.payload, m.qos))
        assert got == [("tls/aio/%d" % i, b"aio %d" % i, 1) for i in range(5)], got
        await c.disconnect()

    asyncio.run(main())


def test_a_ca_that_did_not_sign_the_server_is_refused(tls_broker):
    wrong = context(cert(tls_broker, "other_ca.der"))
    c = tls_client(tls_broker, "tls-wrong-ca", wrong)
    refused(raises((OSError, ValueError), c.connect), BAD_CA)
    assert not c.connected and c.sock is None

    async def main():
        a = aio.Client("tls-wrong-ca-aio", server=tls_broker["host"], port=tls_broker["tls_port"],
                       ssl=wrong, connect_timeout=T)
        refused(await _raised(a.connect()), BAD_CA)
        assert not a.connected

    asyncio.run(main())


async def _raised(coro):
    try:
        await coro
    except (OSError, ValueError) as e:
        return e
    raise AssertionError("connected although verification should have failed")


def test_reconnect_loop_keeps_refusing_a_server_that_fails_verification(tls_broker):
    # loop() with reconnect on: each attempt fails verification and is retried with backoff; the
    # loop reports it (last_error) and never connects.
    c = tls_client(tls_broker, "tls-wrong-ca-loop", context(cert(tls_broker, "other_ca.der")),
                   backoff_min=0.05, backoff_max=0.1)
    try:
        assert c.loop(600) is False
    except ValueError as e:  # MicroPython's mbedtls raises ValueError from the handshake
        raise AssertionError("loop() let the handshake's ValueError out instead of retrying "
                             "(tern.client's _wrap should raise it as OSError): %r" % e)
    assert not c.connected and c._attempt >= 3, c._attempt
    refused(c.last_error, BAD_CA)
    assert isinstance(c.last_error, OSError), repr(c.last_error)


def test_a_server_hostname_the_certificate_does_not_name_is_refused(tls_broker):
    ctx = context(cert(tls_broker, "ca.der"))
    c = tls_client(tls_broker, "tls-wrong-name", ctx, server_hostname="wrong.example")
    refused(raises((OSError, ValueError), c.connect), BAD_NAME)
    # the same CA and port with a name the certificate carries (a DNS entry; the IP entry is what
    # the round trips above use): the name is compared, not just refused
    ok = tls_client(tls_broker, "tls-localhost", ctx, server_hostname="localhost")
    ok.connect()
    assert ok.connected
    ok.disconnect()

    async def main():
        a = aio.Client("tls-wrong-name-aio", server=tls_broker["host"], port=tls_broker["tls_port"],
                       ssl=ctx, server_hostname="wrong.example", connect_timeout=T)
        refused(await _raised(a.connect()), BAD_NAME)

    asyncio.run(main())


def test_ssl_true_means_the_system_cas_which_refuse_the_test_ca(tls_broker):
    # CPython: ssl=True is create_default_context(): the system's CAs, verification and host name
    # checks on, so the test broker's private CA is refused. MicroPython has no system CAs: ssl=True
    # is refused up front with what to pass instead.
    c = tls_client(tls_broker, "tls-true", True)
    if MICROPYTHON:
        refused(raises(ValueError, c.connect), "MicroPython has no system CAs")
    else:
        refused(raises(OSError, c.connect), BAD_CA)

    async def main():
        a = aio.Client("tls-true-aio", server=tls_broker["host"], port=tls_broker["tls_port"], ssl=True,
                       connect_timeout=T)
        if MICROPYTHON:
            try:
                await a.connect()
            except ValueError as e:
                return refused(e, "MicroPython has no system CAs")
            raise AssertionError("ssl=True accepted on MicroPython")
        refused(await _raised(a.connect()), BAD_CA)

    asyncio.run(main())
