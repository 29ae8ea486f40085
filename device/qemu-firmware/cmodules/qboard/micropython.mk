# qboard: the emulated Cortex-M3 board's hardware for Tern (NOR flash, the second UART, the host).
QBOARD_DIR := $(USERMOD_DIR)
SRC_USERMOD_C += $(QBOARD_DIR)/qboard.c
