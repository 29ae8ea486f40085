// What the parts of the qboard module share (qboard.c: host files, flash, ROMFS, the module;
// link.c: the link UART and its carrier line; net.c: the socket module).

#ifndef QBOARD_QBOARD_H
#define QBOARD_QBOARD_H

#include <stddef.h>
#include <stdint.h>
#include "py/obj.h"

// the host's files, by semihosting (QEMU's working directory is the board's folder)
int h_open(const char *path, uint32_t mode);  // mode: 1 "rb", 3 "r+b", 4 "w", 5 "wb"
void h_close(int fd);
void h_seek(int fd, uint32_t pos);
uint32_t h_write(int fd, const void *buf, uint32_t n);  // bytes NOT written
uint32_t h_read(int fd, void *buf, uint32_t n);  // bytes NOT read
int h_flen(int fd);

// the board's UARTs besides the REPL's, drained while code runs (the port's uart_poll())
void qboard_uart_init(void);
void qboard_poll(void);
void link_poll(void);
void net_poll(void);
void net_reset(void);
extern const mp_obj_type_t qb_uart_type;

#endif // QBOARD_QBOARD_H
