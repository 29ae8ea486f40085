// qboard.UART(): the link UART (UART 1) as a non-blocking stream (read/readinto/write, select.poll),
// MQTT over a serial line as with a modem in transparent mode. UART 2 is its carrier line (a modem's
// DCD): when the host's bridge says the far end hung up, reads return end of stream (0) once what the
// far end sent before is read, and go on returning it, as a socket's do when its peer closed, until
// the next CONNECT is written (the bridge dials for it); close() drops the line the other way (a
// modem's DTR: one byte out on UART 2), and the bridge hangs up the far end.
//
// Received bytes are moved from the UART into a ring by link_poll(), called while code runs (the
// port's uart_poll(): the VM hook, waits), so the host's bytes do not wait for the next read. A full
// ring leaves the byte in the UART: QEMU then holds back the sender (no byte is lost).
//
// The control line, in: 5 bytes, a type and a 32-bit little-endian count, the bytes the host had put
// on UART 1 in all. Type 0: the far end hung up. Its data and the notice travel apart (two UARTs, no
// order between them), so end of stream is reported once the bytes sent before the hang-up are all
// in, and from then on (as a socket reports it: a read that found bytes reads on, and must not take
// the end away) until the board dials again (sends CONNECT) or hangs up. Type 1: the answer to the
// board's hang-up: the rest of the bytes sent before it belong to the dropped connection and are
// discarded, as a closed socket discards what it did not read. Out: a byte = the board hangs up.

#include "py/runtime.h"
#include "py/stream.h"
#include "py/mphal.h"
#include "py/mperrno.h"
#include "hw.h"
#include "qboard.h"

#define LINK 1
#define CARRIER 2
#define RX_SIZE (4096)

// Zero-initialised (.bss only: the Cortex-M3 startup copies .data onto itself shifted when the
// image's .ARM.exidx leaves _sidata and _sdata apart, so initialised statics are not safe here).
static uint8_t rx_mem[RX_SIZE];
static uint32_t rx_head, rx_tail;
static int carrier_lost;
static uint32_t lost_at;  // the far end hung up after this many bytes in all (carrier_lost)
static uint32_t rx_count, rx_skip_to;
static int rx_hold;  // after a hang-up, until the host's count comes: UART 1 is not read
static uint8_t ctl[5];
static int ctl_n;

static uint32_t get_u32(const uint8_t *b) {
    return b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint32_t rx_any(void) {
    return (rx_head + RX_SIZE - rx_tail) % RX_SIZE;
}

void link_poll(void) {
    int c;
    while ((c = hw_uart_rx(CARRIER)) >= 0) {
        ctl[ctl_n++] = c;
        if (ctl_n < 5) {
            continue;
        }
        ctl_n = 0;
        if (ctl[0] == 1) {
            rx_skip_to = get_u32(ctl + 1);
            rx_hold = 0;
        } else if (!rx_hold) {
            carrier_lost = 1;
            lost_at = get_u32(ctl + 1);
        }  // (a hang-up notice before the answer to the board's own hang-up: the dropped connection's)
    }
    while (!rx_hold && (rx_head + 1) % RX_SIZE != rx_tail && (c = hw_uart_rx(LINK)) >= 0) {
        if ((int32_t)(rx_skip_to - ++rx_count) >= 0) {
            continue;  // left over from a dropped connection
        }
        rx_mem[rx_head] = c;
        rx_head = (rx_head + 1) % RX_SIZE;
    }
}

static int link_eof(void) {
    // the far end hung up and everything it sent before is read
    link_poll();
    return carrier_lost && rx_head == rx_tail && (int32_t)(rx_count - lost_at) >= 0;
}

static void link_hang_up(void) {
    // the board drops the line (a modem's DTR): what it holds is dropped, and what arrives waits
    // in the UART until the host says how much it had sent (one byte out on the control line asks)
    rx_tail = rx_head;
    carrier_lost = 0;
    rx_hold = 1;
    while (hw_uart_tx_busy(LINK)) {  // the last byte sent is on its way before the line drops
    }
    while (hw_uart_tx_busy(CARRIER)) {
    }
    hw_uart_tx(CARRIER, 0);
}

static void link_tx(const uint8_t *buf, size_t len) {
    if (len && buf[0] == 0x10 && carrier_lost) {
        // a CONNECT: the host dials for it (when it has no connection), a hang-up so far is over,
        // and what the hung-up connection sent and was not read is dropped, as with its socket
        rx_tail = rx_head;
        rx_skip_to = lost_at;
        carrier_lost = 0;
    }
    // After the board's hang-up nothing goes on the link until the host has answered it (1 s at
    // most): the two UARTs keep no order, and a CONNECT that overtook the hang-up would go to the
    // dropped connection's far end, or dial one that the hang-up then closes.
    mp_uint_t start = mp_hal_ticks_ms();
    while (rx_hold && mp_hal_ticks_ms() - start < 1000) {
        qboard_poll();
    }
    for (size_t i = 0; i < len; ++i) {
        while (hw_uart_tx_busy(LINK)) {
            qboard_poll();
        }
        hw_uart_tx(LINK, buf[i]);
    }
}

typedef struct {
    mp_obj_base_t base;
} qb_uart_obj_t;

static const qb_uart_obj_t qb_uart_obj = { { &qb_uart_type } };

static mp_obj_t qb_uart_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw, const mp_obj_t *args) {
    return MP_OBJ_FROM_PTR(&qb_uart_obj);
}

static mp_uint_t qb_uart_read(mp_obj_t self, void *buf, mp_uint_t size, int *err) {
    uint8_t *b = buf;
    mp_uint_t n = 0;
    link_poll();
    while (n < size && rx_head != rx_tail) {
        b[n++] = rx_mem[rx_tail];
        rx_tail = (rx_tail + 1) % RX_SIZE;
    }
    if (n == 0 && size) {
        if (link_eof()) {
            return 0;  // end of stream: the far end hung up (the carrier line), every read from now on
        }
        *err = MP_EAGAIN;
        return MP_STREAM_ERROR;
    }
    return n;
}

static mp_uint_t qb_uart_write(mp_obj_t self, const void *buf, mp_uint_t size, int *err) {
    link_tx(buf, size);
    return size;
}

static mp_uint_t qb_uart_ioctl(mp_obj_t self, mp_uint_t request, uintptr_t arg, int *err) {
    if (request == MP_STREAM_POLL) {
        mp_uint_t r = arg & MP_STREAM_POLL_WR;
        link_poll();
        if ((arg & MP_STREAM_POLL_RD) && (rx_any() || link_eof())) {
            r |= MP_STREAM_POLL_RD;
        }
        return r;
    }
    if (request == MP_STREAM_CLOSE) {
        link_hang_up();  // the line is dropped (DTR): the bridge hangs up the far end; the UART stays usable
        return 0;
    }
    if (request == MP_STREAM_FLUSH) {
        return 0;
    }
    *err = MP_EINVAL;
    return MP_STREAM_ERROR;
}

static mp_obj_t qb_uart_any(mp_obj_t self) {
    link_poll();
    return MP_OBJ_NEW_SMALL_INT(rx_any());
}
static MP_DEFINE_CONST_FUN_OBJ_1(qb_uart_any_obj, qb_uart_any);

static const mp_rom_map_elem_t qb_uart_locals_table[] = {
    { MP_ROM_QSTR(MP_QSTR_read), MP_ROM_PTR(&mp_stream_read_obj) },
    { MP_ROM_QSTR(MP_QSTR_readinto), MP_ROM_PTR(&mp_stream_readinto_obj) },
    { MP_ROM_QSTR(MP_QSTR_write), MP_ROM_PTR(&mp_stream_write_obj) },
    { MP_ROM_QSTR(MP_QSTR_any), MP_ROM_PTR(&qb_uart_any_obj) },
    { MP_ROM_QSTR(MP_QSTR_close), MP_ROM_PTR(&mp_stream_close_obj) },
};
static MP_DEFINE_CONST_DICT(qb_uart_locals, qb_uart_locals_table);

static const mp_stream_p_t qb_uart_stream = {
    .read = qb_uart_read,
    .write = qb_uart_write,
    .ioctl = qb_uart_ioctl,
};

MP_DEFINE_CONST_OBJ_TYPE(qb_uart_type, MP_QSTR_UART, MP_TYPE_FLAG_ITER_IS_STREAM,
    make_new, qb_uart_make_new, protocol, &qb_uart_stream, locals_dict, &qb_uart_locals);
