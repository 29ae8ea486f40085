// qboard: what the Tern qemu boards (MicroPython's qemu port on qemu-system-arm's MPS2-AN385, an
// Arm Cortex-M3, or on qemu-system-riscv32's virt, RISC-V RV32) have besides the port's own: a NOR
// flash, a ROMFS partition, the host's files (semihosting), the link UART (link.c) and a network
// (net.c, the `socket` module). hw.h holds what differs between the two machines.
//
// Flash: one NOR device of `blocks` x `block_size` bytes kept in native memory (hw.h's FLASH_BASE),
// read from the host file flash.img at open and written through to it on every program and erase,
// so it survives power cycles (QEMU exiting). Program only clears bits (asking for a 1 where the
// flash holds 0 raises ValueError), erase sets a block to 0xFF. The wear counters are written
// through to flash.img.wear in the format of firmware/emulated/norflash.py. A power cut at the N-th
// program/erase (cut_at, or arm_cut) tears that operation as norflash.py does (seeded), writes
// cut.json and ends QEMU with exit status 80: the host sees the board lose power.
// Flash(start, count) is a partition of it with MicroPython's extended block protocol.
//
// Boot arguments (the semihosting command line, written by the host): heap=N, the heap's size (the
// firmware holds the largest a profile may ask for; the rest stays unused), and romfs=N, the ROMFS
// partition's size: vfs.rom_ioctl serves it as a board's port does (the host file romfs.img, read
// into hw.h's ROMFS_BASE, erased past its end; writable through rom_ioctl as `mpremote romfs
// deploy` writes a board's), and MicroPython mounts it at /rom at every boot.

#include <string.h>
#include <stdio.h>
#include "py/runtime.h"
#include "py/stream.h"
#include "py/mperrno.h"
#include "py/objstr.h"
#include "shared/runtime/pyexec.h"
#include "extmod/vfs.h"
#include "hw.h"
#include "qboard.h"

#define FLASH_MAX (8u << 20)
#define ROMFS_MAX (8u << 20)
#define MAX_BLOCKS 2048
#define WEAR_HDR 24
#define EXIT_POWER_CUT 80

// ---------------------------------------------------------------- semihosting
int h_open(const char *path, uint32_t mode) {
    uint32_t a[3] = { (uint32_t)path, mode, strlen(path) };
    return (int)semi(0x01, a);
}

void h_close(int fd) {
    uint32_t a[1] = { (uint32_t)fd };
    semi(0x02, a);
}

void h_seek(int fd, uint32_t pos) {
    uint32_t a[2] = { (uint32_t)fd, pos };
    semi(0x0A, a);
}

uint32_t h_write(int fd, const void *buf, uint32_t n) {  // bytes NOT written
    uint32_t a[3] = { (uint32_t)fd, (uint32_t)buf, n };
    return semi(0x05, a);
}

uint32_t h_read(int fd, void *buf, uint32_t n) {  // bytes NOT read
    uint32_t a[3] = { (uint32_t)fd, (uint32_t)buf, n };
    return semi(0x06, a);
}

int h_flen(int fd) {
    uint32_t a[1] = { (uint32_t)fd };
    return (int)semi(0x0C, a);
}

static MP_NORETURN void h_exit(uint32_t code) {
    uint32_t a[2] = { 0x20026, code };  // ADP_Stopped_ApplicationExit with an exit status
    semi(0x20, a);  // SYS_EXIT_EXTENDED
    for (;;) {
    }
}

// ---------------------------------------------------------------- flash state (survives soft reboots)
// In .bss (zero-initialised: see the port's uart.c on .data); fd and wfd hold the handle + 1.
static struct {
    int fd, wfd;
    uint32_t blocks, bs;
    uint32_t ops, cut_at, arm_base, rng;
    uint64_t programs, bytes;
    uint32_t erases[MAX_BLOCKS];
    uint8_t wbuf[16];
} fl;

static uint32_t rnd(void) {
    uint32_t s = fl.rng;
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    fl.rng = s;
    return s;
}

static void seed_rng(uint32_t seed) {
    fl.rng = (uint32_t)(seed * 2654435761u);
    if (!fl.rng) {
        fl.rng = 1;
    }
    for (int i = 0; i < 8; i++) {
        rnd();
    }
}

static void put_u(uint8_t *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) {
        b[i] = v & 0xff;
        v >>= 8;
    }
}

static void persist_counts(void) {
    put_u(fl.wbuf, fl.programs, 8);
    put_u(fl.wbuf + 8, fl.bytes, 8);
    h_seek(fl.wfd - 1, 8);
    h_write(fl.wfd - 1, fl.wbuf, 16);
}

static void persist_erase(uint32_t block) {
    uint8_t b[4];
    put_u(b, fl.erases[block], 4);
    h_seek(fl.wfd - 1, WEAR_HDR + 4 * block);
    h_write(fl.wfd - 1, b, 4);
}

static void persist(uint32_t pos, uint32_t n) {
    h_seek(fl.fd - 1, pos);
    h_write(fl.fd - 1, FLASH_BASE + pos, n);
}

static MP_NORETURN void power_cut(const char *torn) {
    char js[160];
    int n = snprintf(js, sizeof(js), "{\"op\": %u, \"nth\": %u, \"torn\": %s}", (unsigned)fl.ops,
        (unsigned)(fl.ops - fl.arm_base), torn);
    int fd = h_open("cut.json", 4);  // "w"
    if (fd >= 0) {
        h_write(fd, js, n);
        h_close(fd);
    }
    h_exit(EXIT_POWER_CUT);
}

static bool tick(void) {
    fl.ops++;
    return fl.cut_at && fl.ops >= fl.cut_at;
}

static void check_open(void) {
    if (!fl.fd) {
        mp_raise_msg(&mp_type_OSError, MP_ERROR_TEXT("flash not open"));
    }
}

static void program(uint32_t pos, const uint8_t *buf, uint32_t n) {
    uint8_t *mem = FLASH_BASE + pos;
    for (uint32_t i = 0; i < n; i++) {
        if ((mem[i] & buf[i]) != buf[i]) {
            mp_raise_msg_varg(&mp_type_ValueError,
                MP_ERROR_TEXT("NOR: program would set bits at 0x%x: flash holds 0x%02x, data 0x%02x"),
                (unsigned)(pos + i), mem[i], buf[i]);
        }
    }
    if (tick()) {
        // a strict prefix (maybe nothing) or a random subset of the bits to clear
        uint32_t prefix = n && (rnd() & 1);
        uint32_t k = prefix ? rnd() % n : 0;
        for (uint32_t j = 0; j < n; j++) {
            if (!prefix) {
                mem[j] &= buf[j] | (rnd() & 0xff);
            } else if (j < k) {
                mem[j] &= buf[j];
            }
        }
        persist(pos, n);
        fl.programs++;
        fl.bytes += n;
        persist_counts();
        char t[64];
        if (prefix) {
            snprintf(t, sizeof(t), "[\"program-prefix\", %u, %u, %u]", (unsigned)pos, (unsigned)n, (unsigned)k);
        } else {
            snprintf(t, sizeof(t), "[\"program-bits\", %u, %u]", (unsigned)pos, (unsigned)n);
        }
        power_cut(t);
    }
    for (uint32_t i = 0; i < n; i++) {
        mem[i] &= buf[i];
    }
    fl.programs++;
    fl.bytes += n;
    persist(pos, n);
    persist_counts();
}

static void erase(uint32_t block) {
    uint32_t bs = fl.bs, pos = block * bs;
    uint8_t *mem = FLASH_BASE + pos;
    if (tick()) {
        // the start erased and the rest old, the other way round, or weakly erased
        uint32_t mode = rnd() % 3, lo = 0, hi = 0;
        if (mode == 0) {
            hi = 1 + rnd() % (bs - 1);
        } else if (mode == 1) {
            lo = 1 + rnd() % (bs - 1);
            hi = bs;
        }
        for (uint32_t j = 0; j < bs; j++) {
            if (mode == 2) {
                mem[j] |= rnd() & 0xff;
            } else if (lo <= j && j < hi) {
                mem[j] = 0xff;
            }
        }
        persist(pos, bs);
        fl.erases[block]++;
        persist_erase(block);
        char t[48];
        snprintf(t, sizeof(t), "[\"erase\", %u, %u]", (unsigned)block, (unsigned)mode);
        power_cut(t);
    }
    memset(mem, 0xff, bs);
    fl.erases[block]++;
    persist(pos, bs);
    persist_erase(block);
}

// flash_open(blocks, block_size, cut_at=0, seed=1): open flash.img (+ .wear) in the host's board
// directory: True; a second call (after a soft reboot) keeps the open device and its operation
// count: False.
static mp_obj_t qb_flash_open(size_t n_args, const mp_obj_t *args) {
    uint32_t blocks = mp_obj_get_int(args[0]), bs = mp_obj_get_int(args[1]);
    if (fl.fd) {
        if (blocks != fl.blocks || bs != fl.bs) {
            mp_raise_ValueError(MP_ERROR_TEXT("flash already open with another geometry"));
        }
        return mp_const_false;  // a soft reboot: the device stays as it was
    }
    if (blocks == 0 || blocks > MAX_BLOCKS || bs < 64 || (bs & (bs - 1)) || blocks * bs > FLASH_MAX) {
        mp_raise_ValueError(MP_ERROR_TEXT("bad flash geometry"));
    }
    int fd = h_open("flash.img", 3);  // "r+b"
    if (fd < 0) {
        mp_raise_OSError(MP_ENOENT);
    }
    if ((uint32_t)h_flen(fd) != blocks * bs || h_read(fd, FLASH_BASE, blocks * bs) != 0) {
        h_close(fd);
        mp_raise_ValueError(MP_ERROR_TEXT("flash.img does not match the geometry"));
    }
    int wfd = h_open("flash.img.wear", 3);
    uint8_t hdr[WEAR_HDR];
    if (wfd < 0 || (uint32_t)h_flen(wfd) != WEAR_HDR + 4 * blocks || h_read(wfd, hdr, WEAR_HDR) != 0
        || memcmp(hdr, "NORW", 4) != 0 || h_read(wfd, fl.erases, 4 * blocks) != 0) {
        h_close(fd);
        if (wfd >= 0) {
            h_close(wfd);
        }
        mp_raise_ValueError(MP_ERROR_TEXT("flash.img.wear does not match the image"));
    }
    fl.programs = fl.bytes = 0;
    for (int i = 7; i >= 0; i--) {
        fl.programs = (fl.programs << 8) | hdr[8 + i];
        fl.bytes = (fl.bytes << 8) | hdr[16 + i];
    }
    fl.fd = fd + 1;
    fl.wfd = wfd + 1;
    fl.blocks = blocks;
    fl.bs = bs;
    fl.ops = fl.arm_base = 0;
    fl.cut_at = n_args > 2 ? mp_obj_get_int(args[2]) : 0;
    seed_rng(n_args > 3 ? mp_obj_get_int(args[3]) : 1);
    return mp_const_true;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qb_flash_open_obj, 2, 4, qb_flash_open);

// arm_cut(n, seed=None): the power fails at the n-th flash operation from now (1: the next)
static mp_obj_t qb_arm_cut(size_t n_args, const mp_obj_t *args) {
    check_open();
    fl.arm_base = fl.ops;
    fl.cut_at = fl.ops + mp_obj_get_int(args[0]);
    if (n_args > 1 && args[1] != mp_const_none) {
        seed_rng(mp_obj_get_int(args[1]));
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qb_arm_cut_obj, 1, 2, qb_arm_cut);

// counters() -> (ops since power-on, programs, bytes programmed, erases in total)
static mp_obj_t qb_counters(void) {
    check_open();
    uint32_t e = 0;
    for (uint32_t i = 0; i < fl.blocks; i++) {
        e += fl.erases[i];
    }
    mp_obj_t t[4] = { mp_obj_new_int_from_uint(fl.ops), mp_obj_new_int_from_ull(fl.programs),
                      mp_obj_new_int_from_ull(fl.bytes), mp_obj_new_int_from_uint(e) };
    return mp_obj_new_tuple(4, t);
}
static MP_DEFINE_CONST_FUN_OBJ_0(qb_counters_obj, qb_counters);

// ---------------------------------------------------------------- Flash(start, count): a partition
typedef struct {
    mp_obj_base_t base;
    uint32_t start, count;
} qb_flash_obj_t;

static const mp_obj_type_t qb_flash_type;

static mp_obj_t qb_flash_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw, const mp_obj_t *args) {
    mp_arg_check_num(n_args, n_kw, 2, 2, false);
    check_open();
    mp_int_t start = mp_obj_get_int(args[0]), count = mp_obj_get_int(args[1]);
    if (start < 0 || count <= 0 || (uint32_t)(start + count) > fl.blocks) {
        mp_raise_ValueError(MP_ERROR_TEXT("partition outside the flash"));
    }
    qb_flash_obj_t *o = mp_obj_malloc(qb_flash_obj_t, type);
    o->start = start;
    o->count = count;
    return MP_OBJ_FROM_PTR(o);
}

static uint32_t where(qb_flash_obj_t *o, mp_obj_t block, mp_obj_t offset, size_t n) {
    mp_int_t b = mp_obj_get_int(block), off = offset == MP_OBJ_NULL ? 0 : mp_obj_get_int(offset);
    if (b < 0 || off < 0 || (uint64_t)b * fl.bs + off + n > (uint64_t)o->count * fl.bs) {
        mp_raise_ValueError(MP_ERROR_TEXT("access outside the partition"));
    }
    return (o->start + b) * fl.bs + off;
}

static mp_obj_t qb_flash_readblocks(size_t n_args, const mp_obj_t *args) {
    qb_flash_obj_t *o = MP_OBJ_TO_PTR(args[0]);
    mp_buffer_info_t bi;
    mp_get_buffer_raise(args[2], &bi, MP_BUFFER_WRITE);
    uint32_t pos = where(o, args[1], n_args > 3 ? args[3] : MP_OBJ_NULL, bi.len);
    memcpy(bi.buf, FLASH_BASE + pos, bi.len);
    return MP_OBJ_NEW_SMALL_INT(0);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qb_flash_readblocks_obj, 3, 4, qb_flash_readblocks);

static mp_obj_t qb_flash_writeblocks(size_t n_args, const mp_obj_t *args) {
    qb_flash_obj_t *o = MP_OBJ_TO_PTR(args[0]);
    mp_buffer_info_t bi;
    mp_get_buffer_raise(args[2], &bi, MP_BUFFER_READ);
    bool ext = n_args > 3;
    uint32_t pos = where(o, args[1], ext ? args[3] : MP_OBJ_NULL, bi.len);
    if (!ext) {
        // the simple protocol: erase the blocks first (as a board's driver does)
        for (uint32_t b = 0; b < (bi.len + fl.bs - 1) / fl.bs; b++) {
            erase(pos / fl.bs + b);
        }
    }
    program(pos, bi.buf, bi.len);
    return MP_OBJ_NEW_SMALL_INT(0);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qb_flash_writeblocks_obj, 3, 4, qb_flash_writeblocks);

static mp_obj_t qb_flash_ioctl(mp_obj_t self_in, mp_obj_t op_in, mp_obj_t arg_in) {
    qb_flash_obj_t *o = MP_OBJ_TO_PTR(self_in);
    switch (mp_obj_get_int(op_in)) {
        case 1: case 2: case 3:
            return MP_OBJ_NEW_SMALL_INT(0);
        case 4:
            return MP_OBJ_NEW_SMALL_INT(o->count);
        case 5:
            return MP_OBJ_NEW_SMALL_INT(fl.bs);
        case 6: {
            mp_int_t b = mp_obj_get_int(arg_in);
            if (b < 0 || (uint32_t)b >= o->count) {
                mp_raise_ValueError(MP_ERROR_TEXT("erase outside the partition"));
            }
            erase(o->start + b);
            return MP_OBJ_NEW_SMALL_INT(0);
        }
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_3(qb_flash_ioctl_obj, qb_flash_ioctl);

static const mp_rom_map_elem_t qb_flash_locals_table[] = {
    { MP_ROM_QSTR(MP_QSTR_readblocks), MP_ROM_PTR(&qb_flash_readblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_writeblocks), MP_ROM_PTR(&qb_flash_writeblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_ioctl), MP_ROM_PTR(&qb_flash_ioctl_obj) },
};
static MP_DEFINE_CONST_DICT(qb_flash_locals, qb_flash_locals_table);

static MP_DEFINE_CONST_OBJ_TYPE(qb_flash_type, MP_QSTR_Flash, MP_TYPE_FLAG_NONE,
    make_new, qb_flash_make_new, locals_dict, &qb_flash_locals);

// ---------------------------------------------------------------- the host
// host_read(path): the bytes of a file in the host's board directory, None if there is none
static mp_obj_t qb_host_read(mp_obj_t path_in) {
    int fd = h_open(mp_obj_str_get_str(path_in), 1);  // "rb"
    if (fd < 0) {
        return mp_const_none;
    }
    int n = h_flen(fd);
    vstr_t v;
    vstr_init_len(&v, n < 0 ? 0 : n);
    uint32_t left = n > 0 ? h_read(fd, v.buf, n) : 0;
    h_close(fd);
    if (left) {
        vstr_clear(&v);
        mp_raise_OSError(MP_EIO);
    }
    return mp_obj_new_bytes_from_vstr(&v);
}
static MP_DEFINE_CONST_FUN_OBJ_1(qb_host_read_obj, qb_host_read);

// ---------------------------------------------------------------- boot arguments, ROMFS
// The semihosting command line ("firmware heap=N romfs=N"), read once per power-on.
static struct {
    int read;
    uint32_t heap, romfs;
    int loaded, wfd;  // the ROMFS image is in memory; wfd: romfs.img open for writing, + 1
} boot;

static uint32_t arg(const char *cmd, const char *key) {
    size_t k = strlen(key);
    for (const char *p = cmd; (p = strstr(p, key)) != NULL; p += k) {
        if ((p == cmd || p[-1] == ' ') && p[k] == '=') {
            uint32_t v = 0;
            for (p += k + 1; *p >= '0' && *p <= '9'; p++) {
                v = v * 10 + (*p - '0');
            }
            return v;
        }
    }
    return 0;
}

static void read_args(void) {
    if (boot.read) {
        return;
    }
    static char cmd[128];
    uint32_t a[2] = { (uint32_t)cmd, sizeof(cmd) - 1 };
    if (semi(0x15, a) == 0) {  // SYS_GET_CMDLINE
        cmd[sizeof(cmd) - 1] = 0;
        boot.heap = arg(cmd, "heap");
        boot.romfs = arg(cmd, "romfs");
        if (boot.romfs > ROMFS_MAX) {
            boot.romfs = 0;
        }
    }
    boot.read = 1;
}

// the heap's size for main.c's gc_init: the host's heap=N, at most what the firmware holds
size_t qboard_heap_bytes(size_t max) {
    read_args();
    return boot.heap && boot.heap <= max ? boot.heap : max;
}

static void romfs_load(void) {
    // the partition as a board's flash holds it: the image, erased (0xFF) past its end
    if (boot.loaded) {
        return;
    }
    memset(ROMFS_BASE, 0xff, boot.romfs);
    int fd = h_open("romfs.img", 1);
    if (fd >= 0) {
        int n = h_flen(fd);
        if (n > 0 && (uint32_t)n <= boot.romfs) {
            h_read(fd, ROMFS_BASE, n);
        }
        h_close(fd);
    }
    boot.loaded = 1;
}

// vfs.rom_ioctl (MICROPY_VFS_ROM_IOCTL): one partition of romfs=N bytes, when the host gave one
mp_obj_t mp_vfs_rom_ioctl(size_t n_args, const mp_obj_t *args) {
    read_args();
    if (!boot.romfs) {
        return MP_OBJ_NEW_SMALL_INT(-MP_ENODEV);
    }
    mp_int_t cmd = mp_obj_get_int(args[0]);
    if (cmd == MP_VFS_ROM_IOCTL_GET_NUMBER_OF_SEGMENTS) {
        return MP_OBJ_NEW_SMALL_INT(1);
    }
    if (n_args < 2 || mp_obj_get_int(args[1]) != 0) {
        return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
    }
    switch (cmd) {
        case MP_VFS_ROM_IOCTL_GET_SEGMENT:
            romfs_load();
            return mp_obj_new_memoryview('B', boot.romfs, ROMFS_BASE);
        case MP_VFS_ROM_IOCTL_WRITE_PREPARE: {  // (3, 0, length): erased, then written from offset 0
            if (n_args < 3 || (uint32_t)mp_obj_get_int(args[n_args - 1]) > boot.romfs) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
            }
            if (boot.wfd) {
                h_close(boot.wfd - 1);
            }
            boot.wfd = h_open("romfs.img", 5) + 1;  // "wb": the image starts again
            if (!boot.wfd) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EIO);
            }
            memset(ROMFS_BASE, 0xff, boot.romfs);
            boot.loaded = 1;
            return MP_OBJ_NEW_SMALL_INT(4);  // the smallest write
        }
        case MP_VFS_ROM_IOCTL_WRITE: {  // (4, 0, offset, buf)
            mp_buffer_info_t bi;
            if (n_args < 4 || !boot.wfd) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
            }
            mp_get_buffer_raise(args[3], &bi, MP_BUFFER_READ);
            uint32_t off = mp_obj_get_int(args[2]);
            if (off + bi.len > boot.romfs) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
            }
            memcpy(ROMFS_BASE + off, bi.buf, bi.len);
            h_seek(boot.wfd - 1, off);
            return MP_OBJ_NEW_SMALL_INT(h_write(boot.wfd - 1, bi.buf, bi.len) ? -MP_EIO : 0);
        }
        case MP_VFS_ROM_IOCTL_WRITE_COMPLETE:
            if (boot.wfd) {
                h_close(boot.wfd - 1);
                boot.wfd = 0;
            }
            return MP_OBJ_NEW_SMALL_INT(0);
    }
    return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
}

// icount(): instructions executed, modulo 2**30 (exact on RV32; in steps of 40 on the Cortex-M3), as
// QEMU counts them under -icount shift=0 (without it the count follows the host's clock)
static mp_obj_t qb_icount(void) {
    return MP_OBJ_NEW_SMALL_INT(hw_instructions() & 0x3fffffff);
}
static MP_DEFINE_CONST_FUN_OBJ_0(qb_icount_obj, qb_icount);

// the board's UARTs, for the port's uart.c
void qboard_uart_init(void) {
    hw_uart_init();
}

void qboard_poll(void) {
    link_poll();
    net_poll();
}

// net_reset(): the sockets of the boot before are gone (a soft reboot): the host closes what it
// still holds for them (_boot.py calls it)
static mp_obj_t qb_net_reset(void) {
    net_reset();
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_0(qb_net_reset_obj, qb_net_reset);

// exit(code): QEMU ends with this status (0: machine.reset, the host boots the board again)
static mp_obj_t qb_exit(mp_obj_t code) {
    h_exit(mp_obj_get_int(code));
}
static MP_DEFINE_CONST_FUN_OBJ_1(qb_exit_obj, qb_exit);

// raw_repl(): this boot skips main.py and starts at the raw REPL (the firmware's loop reads the mode
// after boot.py), as a soft reset in raw mode does: how the host boots a board to deploy to it
static mp_obj_t qb_raw_repl(void) {
    pyexec_mode_kind = PYEXEC_MODE_RAW_REPL;
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_0(qb_raw_repl_obj, qb_raw_repl);

static const mp_rom_map_elem_t qb_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR_qboard) },
    { MP_ROM_QSTR(MP_QSTR_flash_open), MP_ROM_PTR(&qb_flash_open_obj) },
    { MP_ROM_QSTR(MP_QSTR_arm_cut), MP_ROM_PTR(&qb_arm_cut_obj) },
    { MP_ROM_QSTR(MP_QSTR_counters), MP_ROM_PTR(&qb_counters_obj) },
    { MP_ROM_QSTR(MP_QSTR_Flash), MP_ROM_PTR(&qb_flash_type) },
    { MP_ROM_QSTR(MP_QSTR_UART), MP_ROM_PTR(&qb_uart_type) },
    { MP_ROM_QSTR(MP_QSTR_host_read), MP_ROM_PTR(&qb_host_read_obj) },
    { MP_ROM_QSTR(MP_QSTR_icount), MP_ROM_PTR(&qb_icount_obj) },
    { MP_ROM_QSTR(MP_QSTR_net_reset), MP_ROM_PTR(&qb_net_reset_obj) },
    { MP_ROM_QSTR(MP_QSTR_exit), MP_ROM_PTR(&qb_exit_obj) },
    { MP_ROM_QSTR(MP_QSTR_raw_repl), MP_ROM_PTR(&qb_raw_repl_obj) },
};
static MP_DEFINE_CONST_DICT(qb_globals, qb_globals_table);

const mp_obj_module_t qboard_module = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&qb_globals,
};

MP_REGISTER_MODULE(MP_QSTR_qboard, qboard_module);
