"""A TLS client context that verifies the server, made the same way on both runtimes.

Why it exists: MicroPython's SSLContext starts with verification off (verify_mode CERT_NONE) and
its mbedtls reads DER certificates only; CPython's client context verifies and takes PEM. Users
have PEM files. Loaded only when TLS is used; the drivers' TLS set-up (given, wrap) is here too.
"""

import sys
import ssl

_BEGIN = b"-----BEGIN CERTIFICATE-----"


def der_certs(data):
    """The DER certificates in data: PEM (one or more CERTIFICATE blocks) or one DER certificate."""
    i = data.find(_BEGIN)
    if i < 0:
        if data[:10] == b"-----BEGIN":
            raise ValueError("no CERTIFICATE block in the PEM data")
        return [data]
    from binascii import a2b_base64

    out = []
    while i >= 0:
        j = data.find(b"-----END", i)
        if j < 0:
            raise ValueError("a PEM certificate has no END line")
        out.append(a2b_base64(data[i + len(_BEGIN) : j]))
        i = data.find(_BEGIN, j)
    return out


def given(arg):
    """The context a driver's ssl argument stands for: True, the system's CAs with verification on
    (CPython only; context()); else the argument as it is."""
    return context() if arg is True else arg


def wrap(sock, arg, server_hostname):
    """The blocking client's socket wrapped in TLS."""
    ctx = given(arg)  # a bad ssl argument stays a ValueError
    try:
        return ctx.wrap_socket(sock, server_hostname=server_hostname)
    except OSError:  # CPython's SSLCertVerificationError is a ValueError too: kept as it is
        raise
    except ValueError as e:  # MicroPython's mbedtls: the server failed verification
        raise OSError("TLS: " + str(e).strip())  # like CPython's SSLError: retried with backoff


def context(ca=None, cadata=None):
    """An SSLContext that verifies the server's certificate chain and host name.

    ca: path of a CA certificate file; cadata: its bytes (PEM or DER either way). Without
    either, the system's CAs (CPython; MicroPython has none: ValueError)."""
    if ca is not None:
        with open(ca, "rb") as f:
            cadata = f.read()
    if sys.implementation.name != "micropython":
        ctx = ssl.create_default_context()  # pyright: ignore[reportAttributeAccessIssue]  (CPython)
        for der in der_certs(cadata) if cadata is not None else ():
            ctx.load_verify_locations(cadata=der)
        return ctx
    if cadata is None:
        raise ValueError("MicroPython has no system CAs: give the CA certificate (ca= or cadata=)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for der in der_certs(cadata):
        ctx.load_verify_locations(cadata=der)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
