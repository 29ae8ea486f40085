# The qemu boards' boot (frozen; run by the firmware before boot.py and main.py).
import emuboard

emuboard.boot()
del emuboard
