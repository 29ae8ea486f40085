"""What MicroPython's `json` reads from a text, so the host can tell what a board will make of a file.

MicroPython's parser (extmod/modjson.c, v1.28) is lenient where CPython's is strict: commas and colons
are skipped like spaces, so a trailing comma (`{"a": 1,}`), a missing comma or colon, or a key with no
value (`{"a": 1, "b"}` reads as {"a": 1}) all parse; what it refuses raises ValueError("syntax error
in JSON"). This is that parser's loop, written again in Python from its rules (the tests compare the
two on the same texts through the unix port).
"""

_SPACE = b" \t\n\r"


class MicroPythonJSONError(ValueError):
    """MicroPython's json would raise "syntax error in JSON" for this text."""


def loads(text):
    """The value MicroPython's json.loads (and json.load on a file) returns for `text` (str or bytes);
    MicroPython's own error as MicroPythonJSONError."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    n = len(data)
    i = 0
    stack = []  # the open containers above the current one
    top = None  # the container being filled (or the finished value)
    started = False
    key = _NONE = object()
    fail = MicroPythonJSONError("syntax error in JSON")
    while True:
        if i >= n:
            raise fail  # the text ended inside a container
        c = data[i]
        i += 1
        enter = False
        if c in b",:" or c in _SPACE:
            continue
        if c in b"nft":
            word = {ord("n"): b"null", ord("f"): b"false", ord("t"): b"true"}[c]
            if data[i - 1:i - 1 + len(word)] != word:
                raise fail
            i += len(word) - 1
            value = {b"null": None, b"false": False, b"true": True}[word]
        elif c == ord('"'):
            out = bytearray()
            while i < n and data[i] != ord('"'):
                b = data[i]
                if b == ord("\\"):
                    i += 1
                    b = data[i] if i < n else 0
                    if b == ord("u"):
                        num = 0
                        for _ in range(4):
                            i += 1
                            d = (((data[i] if i < n else 0) | 0x20) - ord("0")) & 0xFF  # a C byte
                            if d > 9:
                                d = (d - (ord("a") - (ord("9") + 1))) & 0xFF
                            num = (num << 4) | d  # (not masked to 4 bits, as in C)
                        out += chr(num).encode("utf-8", "surrogatepass")
                        i += 1
                        continue
                    b = {ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13, ord("t"): 9}.get(b, b)
                out.append(b)
                i += 1
            if i >= n:
                raise fail
            i += 1
            value = out.decode("utf-8", "surrogatepass")  # \ud800 comes out as MicroPython stores it
        elif c == ord("-") or ord("0") <= c <= ord("9"):
            num = bytearray([c])
            flt = False
            while i < n:
                d = data[i]
                if d in b".eE":
                    flt = True
                elif not (d in b"+-" or ord("0") <= d <= ord("9")):
                    break
                num.append(d)
                i += 1
            try:
                value = float(num) if flt else int(num)
            except ValueError:
                raise fail from None
        elif c == ord("["):
            value, enter = [], True
        elif c == ord("{"):
            value, enter = {}, True
        elif c in b"]}":
            if not started:
                raise fail
            if not stack:
                break  # the outermost container closed
            top = stack.pop()
            continue
        else:
            raise fail
        if not started:
            started, top = True, value
            if not enter:
                break  # a lone primitive
            continue
        if isinstance(top, list):
            top.append(value)
        elif key is _NONE:
            key = value
            if enter:
                raise fail  # a container as a key
            try:
                hash(key)
            except TypeError:
                raise fail from None
        else:
            top[key] = value
            key = _NONE
        if enter:
            stack.append(top)
            top = value
    while i < n and data[i] in _SPACE + b"\x0b\x0c":
        i += 1
    if i < n or stack:
        raise fail
    return top
