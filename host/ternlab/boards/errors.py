"""A board's errors, apart from the Board interface so that what works on boards (deploy) and the
interface (whose deploy() uses it) both import them without importing each other."""


class BoardError(Exception):
    """The board could not do what was asked (no answer, not running, bad input)."""


class PowerLost(BoardError):
    """The board lost power while the host was talking to it."""


class DeviceError(BoardError):
    """Code run on the board raised: `traceback` is the board's traceback text."""

    def __init__(self, traceback, output=""):
        self.traceback = traceback
        self.output = output
        last = traceback.strip().splitlines()[-1] if traceback.strip() else "error"
        super().__init__("the board raised: %s" % last)
