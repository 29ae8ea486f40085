"""A board's console log: every line it printed, timestamped, in memory and in a file.

Fed with the raw bytes read from the board (and told what the host wrote, so
the raw REPL's framing -- the raw-paste handshake, the Ctrl-D markers, the
"OK" and ">" of each command -- is left out and what remains reads like the
board's output). A test waits for a line with `wait_for(pattern)`; `mark()`
gives the index to wait from so earlier lines do not match.
"""

import re
import threading
import time

_RAW_BANNER = "raw REPL; CTRL-B to exit"


class Line:
    __slots__ = ("t", "mono", "text", "kind")

    def __init__(self, t, mono, text, kind):
        self.t = t  # wall clock (time.time())
        self.mono = mono  # seconds since the log was opened
        self.text = text
        self.kind = kind  # "out": printed by the board; "event": said by the harness

    def __repr__(self):
        return "Line(%+.3f, %r%s)" % (self.mono, self.text, "" if self.kind == "out" else ", event")

    def format(self):
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.t)) + ".%03dZ" % (int(self.t * 1000) % 1000)
        tag = "" if self.kind == "out" else "# "
        return "%s %+10.3f %s%s\n" % (ts, self.mono, tag, self.text)


class ConsoleLog:
    def __init__(self, path=None, echo=None):
        """path: file the lines are appended to; echo: callable(Line) for each line."""
        self.path = path
        self.lines = []
        self._buf = bytearray()
        self._after_eot = False
        self._paste = False
        self._cond = threading.Condition()
        self._t0 = time.monotonic()
        self._echo = echo
        self._f = open(path, "a", encoding="utf-8") if path else None

    # -- input ---------------------------------------------------------------
    def host_wrote(self, data):
        """What the host sent the board: the raw-paste handshake starts here."""
        if b"\x05A\x01" in data:
            with self._cond:
                self._paste = True

    def feed(self, data):
        """Bytes the board printed."""
        with self._cond:
            for b in data:
                if self._paste:  # raw-paste flow control up to its closing Ctrl-D
                    if b == 4:
                        self._paste = False
                        self._after_eot = True
                    continue
                if b == 10 or b == 4:
                    self._end_line()
                    if b == 4:
                        self._after_eot = True
                elif b >= 32 or b == 9:
                    self._buf.append(b)

    def event(self, text):
        """A line from the harness itself (power cut, reset, ...)."""
        with self._cond:
            self._add(text, "event")

    def _end_line(self):
        text = self._buf.decode("utf-8", "replace").rstrip()
        self._buf.clear()
        if self._after_eot:  # a raw REPL command's output starts with ">" and "OK"
            if text.startswith(">"):
                text = text[1:]
            if text.startswith("OK"):
                text = text[2:]
            self._after_eot = False
        if text and text not in (_RAW_BANNER, ">", ">OK", "OK"):
            self._add(text, "out")

    def _add(self, text, kind):
        now = time.time()
        line = Line(now, time.monotonic() - self._t0, text, kind)
        self.lines.append(line)
        if self._f is not None:
            self._f.write(line.format())
            self._f.flush()
        if self._echo is not None:
            self._echo(line)
        self._cond.notify_all()

    # -- output --------------------------------------------------------------
    def mark(self):
        """Index of the next line: pass it as `since` to wait for later lines only."""
        with self._cond:
            return len(self.lines)

    def texts(self, since=0, kind="out"):
        with self._cond:
            return [ln.text for ln in self.lines[since:] if kind is None or ln.kind == kind]

    def find(self, pattern, since=0, kind="out"):
        """The first match of pattern (a regex) in a line at or after `since`, or None."""
        rx = re.compile(pattern)
        with self._cond:
            return self._find(rx, since, kind)[0]

    def _find(self, rx, since, kind):
        for i in range(since, len(self.lines)):
            ln = self.lines[i]
            if kind is None or ln.kind == kind:
                m = rx.search(ln.text)
                if m:
                    return m, i
        return None, len(self.lines)

    def wait_for(self, pattern, timeout=10.0, since=0, kind="out", pump=None):
        """Wait until a line at or after `since` matches `pattern` (regex search);
        returns the match. `pump()` is called while waiting when the log is fed
        by the caller's thread (a serial port read on demand). Raises
        TimeoutError naming the pattern and the last lines seen."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        start = since
        while True:
            with self._cond:
                m, start = self._find(rx, start, kind)
                if m:
                    return m
                left = end - time.monotonic()
                if left <= 0:
                    tail = [ln.text for ln in self.lines[-5:]]
                    raise TimeoutError("no console line matched %r within %.1f s (last lines: %r)" % (pattern, timeout, tail))
                if pump is None:
                    self._cond.wait(min(left, 0.5))
            if pump is not None:
                pump(min(left, 0.05))

    def close(self):
        with self._cond:
            if self._buf:
                self._end_line()
            if self._f is not None:
                self._f.close()
                self._f = None
