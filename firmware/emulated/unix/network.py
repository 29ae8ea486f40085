"""The emulated board's Wi-Fi: network.WLAN (station only) whose link the host switches.

emuboard.boot() imports this module for a profile with "network": "wifi" and hands it the board's
link file: one byte the host writes ("1" up, "0" down; ternlab's EmulatedBoard.set_link). The app
then sees its link go and come back as on a board whose access point went away, while readings go
on. Association is instant: the station is connected whenever it is active and the host says the
link is up (a board reconnects to its access point by itself). The TCP connections are the host's:
when it cuts the link it also closes them, as a dead link ends them on a board.
"""

STA_IF = 0
AP_IF = 1
STAT_CONNECTING = 1001
STAT_GOT_IP = 1010

_link = None  # the link file, opened by emuboard.boot() while "/" was still the host's


class WLAN:
    def __init__(self, interface=STA_IF):
        if interface != STA_IF:
            raise ValueError("the emulated board has a station interface only")
        self._on = False

    def active(self, on=None):
        if on is None:
            return self._on
        self._on = bool(on)

    def connect(self, ssid=None, key=None, **kw):
        pass

    def disconnect(self):
        pass

    def isconnected(self):
        if not self._on:
            return False
        _link.seek(0)
        return _link.read(1) != b"0"

    def status(self, param=None):
        if param == "rssi":
            return -55
        if param is not None:
            raise ValueError("unknown status param %r" % param)
        return STAT_GOT_IP if self.isconnected() else STAT_CONNECTING

    def ifconfig(self):
        return ("127.0.0.1", "255.0.0.0", "127.0.0.1", "127.0.0.1")
