# qboard: the qemu boards' hardware for Tern (NOR flash, ROMFS, the host's files, the link UART, the
# network's `socket` module), on either machine (hw.h).
QBOARD_DIR := $(USERMOD_DIR)
SRC_USERMOD_C += $(QBOARD_DIR)/qboard.c $(QBOARD_DIR)/link.c $(QBOARD_DIR)/net.c
