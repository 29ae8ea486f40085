// socket: TCP sockets on the qemu boards, as a board's own `socket` module has them (getaddrinfo,
// socket, connect, send/recv/read/write/readinto/readline, setblocking/settimeout, select.poll,
// close), so an app that dials `Client(server=..., port=...)` runs here as on an ESP32. The board
// has no IP stack: each socket is a channel over UART 3 to the host (ternlab.boards.qemu_net), which
// resolves names and dials what the app asked for (the host's loopback only; anything else is
// refused with an OSError that says so).
//
// Frames, both ways: type, channel, length (16-bit little-endian), payload.
//   board -> host: 'R' resolve (payload: the name), 'O' open (port, big-endian, then the host),
//                  'D' data, 'C' close, 'W' window (bytes read since the last, 16-bit), 'Z' the
//                  board rebooted: every channel of the boot before is closed
//   host -> board: 'r' resolved (0 + 4 address bytes, or 1 + why), 'o' opened (errno, 0 when
//                  connected, + why), 'D' data, 'E' the far end closed (errno, 0 for a clean end of
//                  stream), 'W' window (bytes passed on to the far end), 'x' a close is done,
//                  'z' every channel of the boot before is closed (the answer to 'Z')
// Flow control both ways, per socket: the host sends at most RX_CAP bytes the app has not read
// (the board's 'W' frames give them back), the board at most TX_WIN bytes the host has not passed
// on (a far end that stops reading fills it: a non-blocking write then returns None, as a socket's
// does when its send buffer is full). So one socket's bytes never hold up another's, and no byte
// is lost. A power cut leaves the host's connections open and silent, as a board that vanished.

#include <string.h>
#include "py/runtime.h"
#include "py/stream.h"
#include "py/mphal.h"
#include "py/mperrno.h"
#include "hw.h"
#include "qboard.h"

#define NET 3
#define NCH 8  // sockets at once (an ESP32's lwIP build allows 10)
#define RX_CAP 2048  // per socket, bytes the host may send before the app reads them (a power of two)
#define TX_WIN 2048  // per socket, bytes the board may send before the host has passed them on
#define FRAME_MAX 1024
#define WHY_MAX 120

enum { S_FREE, S_IDLE, S_CONNECTING, S_OPEN, S_CLOSING };

typedef struct {
    uint8_t state, eof;
    int16_t err;  // the dial failed or the connection broke (errno): sticky
    uint16_t head, tail;  // receive ring (head - tail bytes, modulo 2**16)
    uint16_t unacked, credit;
    uint8_t buf[RX_CAP];
} chan_t;

// .bss only (see link.c)
static chan_t chans[NCH];
static struct {
    uint8_t hdr[4];
    int hdr_n;
    uint32_t left;  // payload bytes still to come of the frame in hand
    uint8_t msg[WHY_MAX + 8];
    uint32_t msg_n;
} rx;
static int resolving;  // 1 while a resolve waits, 2 answered
static uint8_t resolved[5];
static char why[WHY_MAX + 1];  // the host's words for the last failure

// ---------------------------------------------------------------- frames
static void net_tx(uint8_t type, int ch, const void *payload, size_t n) {
    // whole frames only: nothing in here raises (a KeyboardInterrupt waits for the caller's wait)
    uint8_t hdr[4] = { type, ch, n & 0xff, n >> 8 };
    for (int k = 0; k < 2; k++) {
        const uint8_t *p = k ? payload : hdr;
        size_t len = k ? n : 4;
        for (size_t i = 0; i < len; i++) {
            while (hw_uart_tx_busy(NET)) {
                qboard_poll();
            }
            hw_uart_tx(NET, p[i]);
        }
    }
}

static void set_why(const uint8_t *p, size_t n) {
    if (n > WHY_MAX) {
        n = WHY_MAX;
    }
    memcpy(why, p, n);
    why[n] = 0;
}

static void frame_done(uint8_t type, chan_t *c) {
    // a control frame is in (rx.msg, rx.msg_n bytes)
    uint8_t *m = rx.msg;
    uint32_t n = rx.msg_n;
    if (type == 'r') {
        memcpy(resolved, m, n < 5 ? n : 5);
        if (n && m[0]) {
            set_why(m + 1, n - 1);
        }
        resolving = 2;
        return;
    }
    if (c == NULL) {
        return;
    }
    if (type == 'x') {
        if (c->state == S_CLOSING) {
            c->state = S_FREE;
        }
        return;
    }
    if (type == 'z') {  // the host closed every channel of the boot before
        for (int ch = 0; ch < NCH; ch++) {
            if (chans[ch].state == S_CLOSING) {
                chans[ch].state = S_FREE;
            }
        }
        return;
    }
    if (c->state != S_CONNECTING && c->state != S_OPEN) {
        return;  // a closed socket's
    }
    if (type == 'o' && n) {
        c->state = S_OPEN;
        c->credit = TX_WIN;
        if (m[0]) {
            c->err = m[0];
            set_why(m + 1, n - 1);
        }
    } else if (type == 'E' && n) {
        c->eof = 1;
        if (m[0]) {
            c->err = m[0];
        }
    } else if (type == 'W' && n >= 2) {
        c->credit += m[0] | m[1] << 8;
    }
}

void net_poll(void) {
    int b;
    while ((b = hw_uart_rx(NET)) >= 0) {
        if (rx.hdr_n < 4) {
            rx.hdr[rx.hdr_n++] = b;
            if (rx.hdr_n < 4) {
                continue;
            }
            rx.left = rx.hdr[2] | rx.hdr[3] << 8;
            rx.msg_n = 0;
        } else {
            chan_t *c = rx.hdr[1] < NCH ? &chans[rx.hdr[1]] : NULL;
            rx.left--;
            if (rx.hdr[0] == 'D') {
                if (c && c->state == S_OPEN && (uint16_t)(c->head - c->tail) < RX_CAP) {
                    c->buf[c->head++ % RX_CAP] = b;
                }
            } else if (rx.msg_n < sizeof(rx.msg)) {
                rx.msg[rx.msg_n++] = b;
            }
        }
        if (rx.left == 0) {
            if (rx.hdr[0] != 'D') {
                frame_done(rx.hdr[0], rx.hdr[1] < NCH ? &chans[rx.hdr[1]] : NULL);
            }
            rx.hdr_n = 0;
        }
    }
}

void net_reset(void) {
    // A (soft) boot: the sockets of the boot before are gone. Their channels wait for the host's 'z'
    // (it closed them all): what it sent for them before comes first, and must not reach a new
    // socket on the same channel. The frame parser goes on (the UART's stream does not restart).
    for (int ch = 0; ch < NCH; ch++) {
        chans[ch].state = S_CLOSING;
    }
    resolving = 0;
    net_tx('Z', 0, NULL, 0);
}

// Wait until done(c) or the timeout (ms; -1: for ever); Ctrl-C raises here. False: timed out.
static bool wait_for(bool (*done)(chan_t *), chan_t *c, int32_t timeout) {
    mp_uint_t start = mp_hal_ticks_ms();
    for (;;) {
        qboard_poll();
        if (done(c)) {
            return true;
        }
        if (timeout >= 0 && mp_hal_ticks_ms() - start >= (mp_uint_t)timeout) {
            return false;
        }
        mp_handle_pending(true);
    }
}

static MP_NORETURN void raise_why(int err) {
    mp_obj_t args[2] = { MP_OBJ_NEW_SMALL_INT(err), mp_obj_new_str_from_cstr(why) };
    nlr_raise(mp_obj_new_exception_args(&mp_type_OSError, why[0] ? 2 : 1, args));
}

// ---------------------------------------------------------------- getaddrinfo
static bool answered(chan_t *c) {
    return resolving == 2;
}

// getaddrinfo(host, port, af=0, type=0, proto=0, flags=0): resolved by the host
static mp_obj_t net_getaddrinfo(size_t n_args, const mp_obj_t *args) {
    size_t len;
    const char *host = mp_obj_str_get_data(args[0], &len);
    mp_int_t port = mp_obj_get_int(args[1]);
    if (len > 253) {
        mp_raise_ValueError(MP_ERROR_TEXT("host name too long"));
    }
    resolving = 1;
    why[0] = 0;
    net_tx('R', 0, host, len);
    if (!wait_for(answered, NULL, 10000)) {
        resolving = 0;
        mp_raise_OSError(MP_ETIMEDOUT);
    }
    resolving = 0;
    if (resolved[0]) {
        raise_why(-2);  // as CPython's socket.gaierror: the name is not known
    }
    vstr_t ip;
    vstr_init(&ip, 16);
    vstr_printf(&ip, "%u.%u.%u.%u", resolved[1], resolved[2], resolved[3], resolved[4]);
    mp_obj_t addr[2] = { mp_obj_new_str_from_vstr(&ip), MP_OBJ_NEW_SMALL_INT(port) };
    mp_obj_t ai[5] = { MP_OBJ_NEW_SMALL_INT(2), MP_OBJ_NEW_SMALL_INT(1), MP_OBJ_NEW_SMALL_INT(6),
                       MP_OBJ_NEW_QSTR(MP_QSTR_), mp_obj_new_tuple(2, addr) };
    mp_obj_t one = mp_obj_new_tuple(5, ai);
    return mp_obj_new_list(1, &one);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(net_getaddrinfo_obj, 2, 6, net_getaddrinfo);

// ---------------------------------------------------------------- socket
typedef struct {
    mp_obj_base_t base;
    int ch;  // -1 once closed
    int32_t timeout;  // ms; -1 blocking, 0 non-blocking
} sock_obj_t;

static const mp_obj_type_t sock_type;

static chan_t *chan_of(sock_obj_t *s, int *err) {
    if (s->ch < 0) {
        *err = MP_EBADF;
        return NULL;
    }
    return &chans[s->ch];
}

static int free_chan(void) {
    for (int ch = 0; ch < NCH; ch++) {
        if (chans[ch].state == S_FREE) {
            return ch;
        }
    }
    return -1;
}

static bool closed_one(chan_t *unused) {
    // a free channel, or none that is only waiting for the host to finish a close
    bool closing = false;
    for (int ch = 0; ch < NCH; ch++) {
        if (chans[ch].state == S_FREE) {
            return true;
        }
        closing |= chans[ch].state == S_CLOSING;
    }
    return !closing;
}

static mp_obj_t sock_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw, const mp_obj_t *args) {
    mp_arg_check_num(n_args, n_kw, 0, 3, false);
    if ((n_args > 0 && mp_obj_get_int(args[0]) != 2) || (n_args > 1 && mp_obj_get_int(args[1]) != 1)) {
        mp_raise_OSError(MP_EAFNOSUPPORT);  // IPv4 TCP only
    }
    int ch = free_chan();
    if (ch < 0 && wait_for(closed_one, NULL, 1000)) {  // a socket just closed: its channel comes back at once
        ch = free_chan();
    }
    if (ch < 0) {
        mp_raise_OSError(MP_ENFILE);  // every socket in use
    }
    memset(&chans[ch], 0, offsetof(chan_t, buf));
    chans[ch].state = S_IDLE;
    sock_obj_t *s = mp_obj_malloc_with_finaliser(sock_obj_t, &sock_type);
    s->ch = ch;
    s->timeout = -1;
    return MP_OBJ_FROM_PTR(s);
}

static bool connect_answered(chan_t *c) {
    return c->state != S_CONNECTING;
}

static mp_obj_t sock_connect(mp_obj_t self_in, mp_obj_t addr_in) {
    sock_obj_t *s = MP_OBJ_TO_PTR(self_in);
    int err = 0;
    chan_t *c = chan_of(s, &err);
    if (c == NULL) {
        mp_raise_OSError(err);
    }
    if (c->state != S_IDLE) {
        mp_raise_OSError(c->state == S_CONNECTING ? MP_EALREADY : MP_EISCONN);
    }
    mp_obj_t *a;
    mp_obj_get_array_fixed_n(addr_in, 2, &a);
    size_t len;
    const char *host = mp_obj_str_get_data(a[0], &len);
    mp_int_t port = mp_obj_get_int(a[1]);
    if (len > 253 || port <= 0 || port > 65535) {
        mp_raise_ValueError(MP_ERROR_TEXT("bad address"));
    }
    uint8_t p[256] = { port >> 8, port & 0xff };
    memcpy(p + 2, host, len);
    c->state = S_CONNECTING;
    why[0] = 0;
    net_tx('O', s->ch, p, len + 2);
    if (s->timeout == 0) {
        mp_raise_OSError(MP_EINPROGRESS);
    }
    if (!wait_for(connect_answered, c, s->timeout)) {
        mp_raise_OSError(MP_ETIMEDOUT);  // (the host answers later: close() drops that connection)
    }
    if (c->err) {
        raise_why(c->err);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(sock_connect_obj, sock_connect);

// what a wait on a connected socket waits for (a dial that is answered ends it too)
static bool readable(chan_t *c) {
    return c->head != c->tail || c->eof || c->err || (c->state != S_OPEN && c->state != S_CONNECTING);
}

static bool writable(chan_t *c) {
    return c->credit || c->err || (c->state != S_OPEN && c->state != S_CONNECTING);
}

static mp_uint_t sock_read(mp_obj_t self_in, void *buf, mp_uint_t size, int *errcode) {
    sock_obj_t *s = MP_OBJ_TO_PTR(self_in);
    chan_t *c = chan_of(s, errcode);
    if (c == NULL) {
        return MP_STREAM_ERROR;
    }
    if (!readable(c)) {
        if (s->timeout == 0) {
            *errcode = MP_EAGAIN;
            return MP_STREAM_ERROR;
        }
        if (!wait_for(readable, c, s->timeout)) {
            *errcode = MP_ETIMEDOUT;
            return MP_STREAM_ERROR;
        }
    }
    uint16_t n = c->head - c->tail;
    if (n) {  // what came before an error or the end is read first
        if (n > size) {
            n = size;
        }
        for (uint16_t i = 0; i < n; i++) {
            ((uint8_t *)buf)[i] = c->buf[c->tail++ % RX_CAP];
        }
        c->unacked += n;
        if (c->unacked >= RX_CAP / 4 || c->head == c->tail) {
            uint8_t w[2] = { c->unacked & 0xff, c->unacked >> 8 };
            c->unacked = 0;
            net_tx('W', s->ch, w, 2);
        }
        return n;
    }
    if (c->err) {
        *errcode = c->err;
        return MP_STREAM_ERROR;
    }
    if (c->eof) {
        return 0;
    }
    *errcode = MP_ENOTCONN;
    return MP_STREAM_ERROR;
}

static mp_uint_t sock_write(mp_obj_t self_in, const void *buf, mp_uint_t size, int *errcode) {
    sock_obj_t *s = MP_OBJ_TO_PTR(self_in);
    chan_t *c = chan_of(s, errcode);
    if (c == NULL) {
        return MP_STREAM_ERROR;
    }
    if (!writable(c)) {
        if (s->timeout == 0) {
            *errcode = MP_EAGAIN;
            return MP_STREAM_ERROR;
        }
        if (!wait_for(writable, c, s->timeout)) {
            *errcode = MP_ETIMEDOUT;
            return MP_STREAM_ERROR;
        }
    }
    if (c->err || c->state != S_OPEN) {
        *errcode = c->err ? c->err : MP_ENOTCONN;
        return MP_STREAM_ERROR;
    }
    mp_uint_t n = size < c->credit ? size : c->credit;
    if (n > FRAME_MAX) {
        n = FRAME_MAX;
    }
    c->credit -= n;
    net_tx('D', s->ch, buf, n);
    return n;
}

static void sock_close(sock_obj_t *s) {
    if (s->ch < 0) {
        return;
    }
    chan_t *c = &chans[s->ch];
    if (c->state == S_IDLE) {
        c->state = S_FREE;
    } else if (c->state == S_CONNECTING || c->state == S_OPEN) {
        c->state = S_CLOSING;  // free again once the host has closed its end
        net_tx('C', s->ch, NULL, 0);
    }
    s->ch = -1;
}

static mp_uint_t sock_ioctl(mp_obj_t self_in, mp_uint_t request, uintptr_t arg, int *errcode) {
    sock_obj_t *s = MP_OBJ_TO_PTR(self_in);
    if (request == MP_STREAM_CLOSE) {
        sock_close(s);
        return 0;
    }
    if (request != MP_STREAM_POLL) {
        *errcode = MP_EINVAL;
        return MP_STREAM_ERROR;
    }
    chan_t *c = chan_of(s, errcode);
    if (c == NULL) {
        return MP_STREAM_POLL_NVAL;
    }
    qboard_poll();
    mp_uint_t r = 0;
    if (c->state == S_OPEN || c->state == S_IDLE) {
        if ((arg & MP_STREAM_POLL_RD) && readable(c)) {
            r |= MP_STREAM_POLL_RD;
        }
        if ((arg & MP_STREAM_POLL_WR) && writable(c)) {
            r |= MP_STREAM_POLL_WR;
        }
        if (c->err) {
            r |= MP_STREAM_POLL_ERR;
        }
    }
    return r;
}

// recv(n) and send(buf) raise where read and write return None: OSError(EAGAIN) on a non-blocking
// socket with nothing to read (or no room), as a board's sockets do
static mp_obj_t sock_recv(mp_obj_t self_in, mp_obj_t len_in) {
    mp_int_t n = mp_obj_get_int(len_in);
    vstr_t v;
    vstr_init_len(&v, n < 0 ? 0 : n);
    int err = 0;
    mp_uint_t r = n > 0 ? sock_read(self_in, v.buf, n, &err) : 0;
    if (r == MP_STREAM_ERROR) {
        vstr_clear(&v);
        mp_raise_OSError(err);
    }
    v.len = r;
    return mp_obj_new_bytes_from_vstr(&v);
}
static MP_DEFINE_CONST_FUN_OBJ_2(sock_recv_obj, sock_recv);

static mp_obj_t sock_send(mp_obj_t self_in, mp_obj_t buf_in) {
    mp_buffer_info_t bi;
    mp_get_buffer_raise(buf_in, &bi, MP_BUFFER_READ);
    int err = 0;
    mp_uint_t r = bi.len ? sock_write(self_in, bi.buf, bi.len, &err) : 0;
    if (r == MP_STREAM_ERROR) {
        mp_raise_OSError(err);
    }
    return MP_OBJ_NEW_SMALL_INT(r);
}
static MP_DEFINE_CONST_FUN_OBJ_2(sock_send_obj, sock_send);

static mp_obj_t sock_settimeout(mp_obj_t self_in, mp_obj_t t) {
    sock_obj_t *s = MP_OBJ_TO_PTR(self_in);
    if (t == mp_const_none) {
        s->timeout = -1;
    } else {
        #if MICROPY_PY_BUILTINS_FLOAT
        mp_float_t f = mp_obj_get_float(t);
        #else
        mp_int_t f = mp_obj_get_int(t);
        #endif
        if (f < 0) {
            mp_raise_ValueError(MP_ERROR_TEXT("timeout must be >= 0"));
        }
        s->timeout = (int32_t)(f * 1000);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(sock_settimeout_obj, sock_settimeout);

static mp_obj_t sock_setblocking(mp_obj_t self_in, mp_obj_t flag) {
    ((sock_obj_t *)MP_OBJ_TO_PTR(self_in))->timeout = mp_obj_is_true(flag) ? -1 : 0;
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(sock_setblocking_obj, sock_setblocking);

static mp_obj_t sock_setsockopt(size_t n_args, const mp_obj_t *args) {
    return mp_const_none;  // the host's end has TCP_NODELAY; the rest means nothing here
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(sock_setsockopt_obj, 4, 4, sock_setsockopt);

static mp_obj_t sock_makefile(size_t n_args, const mp_obj_t *args) {
    return args[0];
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(sock_makefile_obj, 1, 3, sock_makefile);

static const mp_rom_map_elem_t sock_locals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___del__), MP_ROM_PTR(&mp_stream_close_obj) },
    { MP_ROM_QSTR(MP_QSTR_close), MP_ROM_PTR(&mp_stream_close_obj) },
    { MP_ROM_QSTR(MP_QSTR_connect), MP_ROM_PTR(&sock_connect_obj) },
    { MP_ROM_QSTR(MP_QSTR_send), MP_ROM_PTR(&sock_send_obj) },
    { MP_ROM_QSTR(MP_QSTR_sendall), MP_ROM_PTR(&mp_stream_write_obj) },
    { MP_ROM_QSTR(MP_QSTR_recv), MP_ROM_PTR(&sock_recv_obj) },
    { MP_ROM_QSTR(MP_QSTR_read), MP_ROM_PTR(&mp_stream_read_obj) },
    { MP_ROM_QSTR(MP_QSTR_readinto), MP_ROM_PTR(&mp_stream_readinto_obj) },
    { MP_ROM_QSTR(MP_QSTR_readline), MP_ROM_PTR(&mp_stream_unbuffered_readline_obj) },
    { MP_ROM_QSTR(MP_QSTR_write), MP_ROM_PTR(&mp_stream_write_obj) },
    { MP_ROM_QSTR(MP_QSTR_settimeout), MP_ROM_PTR(&sock_settimeout_obj) },
    { MP_ROM_QSTR(MP_QSTR_setblocking), MP_ROM_PTR(&sock_setblocking_obj) },
    { MP_ROM_QSTR(MP_QSTR_setsockopt), MP_ROM_PTR(&sock_setsockopt_obj) },
    { MP_ROM_QSTR(MP_QSTR_makefile), MP_ROM_PTR(&sock_makefile_obj) },
};
static MP_DEFINE_CONST_DICT(sock_locals, sock_locals_table);

static const mp_stream_p_t sock_stream = {
    .read = sock_read,
    .write = sock_write,
    .ioctl = sock_ioctl,
};

static MP_DEFINE_CONST_OBJ_TYPE(sock_type, MP_QSTR_socket, MP_TYPE_FLAG_NONE,
    make_new, sock_make_new, protocol, &sock_stream, locals_dict, &sock_locals);

static const mp_rom_map_elem_t net_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR_socket) },
    { MP_ROM_QSTR(MP_QSTR_socket), MP_ROM_PTR(&sock_type) },
    { MP_ROM_QSTR(MP_QSTR_getaddrinfo), MP_ROM_PTR(&net_getaddrinfo_obj) },
    { MP_ROM_QSTR(MP_QSTR_AF_INET), MP_ROM_INT(2) },
    { MP_ROM_QSTR(MP_QSTR_SOCK_STREAM), MP_ROM_INT(1) },
    { MP_ROM_QSTR(MP_QSTR_IPPROTO_TCP), MP_ROM_INT(6) },
    { MP_ROM_QSTR(MP_QSTR_TCP_NODELAY), MP_ROM_INT(1) },
    { MP_ROM_QSTR(MP_QSTR_SOL_SOCKET), MP_ROM_INT(1) },
    { MP_ROM_QSTR(MP_QSTR_SO_REUSEADDR), MP_ROM_INT(2) },
};
static MP_DEFINE_CONST_DICT(net_globals, net_globals_table);

const mp_obj_module_t net_module = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&net_globals,
};

MP_REGISTER_EXTENSIBLE_MODULE(MP_QSTR_socket, net_module);
