// What differs between the two emulated microcontrollers, and nothing else: where the flash model
// and the ROMFS partition sit in memory, how to call the host (semihosting), the board's extra UARTs
// (1: the link UART, 2: its carrier line, 3: the network) and the instruction counter.
//
// - Cortex-M3 (QEMU_SOC_MPS2, qemu-system-arm -machine mps2-an385): UARTs 1-3 are the board's own
//   CMSDK UARTs (one-byte buffers); the flash model in its PSRAM at 0x21000000; semihosting with
//   `bkpt 0xab`; instructions counted by APB timer 0 (25 MHz under -icount shift=0: one tick every
//   40 instructions).
// - RISC-V RV32 (QEMU_SOC_VIRT, qemu-system-riscv32 -machine virt, the ESP32-C3's ISA): `virt` has one
//   ns16550a (the REPL), so UARTs 1-3 are the ports of a pci-serial-4x the host plugs into slot 2:
//   16550s with 16-byte FIFOs, their I/O BAR put at 0x1000 of the PCIe I/O window (0x03000000)
//   through the ECAM config space (0x30000000); flash and ROMFS in RAM above the firmware's;
//   semihosting with the `slli/ebreak/srai` sequence; instructions from the instret counter.

#ifndef QBOARD_HW_H
#define QBOARD_HW_H

#include <stdint.h>

#if defined(QEMU_SOC_MPS2)

#define FLASH_BASE ((uint8_t *)0x21000000)
#define ROMFS_BASE ((uint8_t *)0x21800000)

static inline uint32_t semi(uint32_t num, const void *arg) {
    register uint32_t r0 __asm__ ("r0") = num;
    register const void *r1 __asm__ ("r1") = arg;
    __asm__ __volatile__ ("bkpt 0xAB\n" : "+r" (r0) : "r" (r1) : "memory");
    return r0;
}

typedef struct {
    volatile uint32_t DATA, STATE, CTRL, INTSTATUS, BAUDDIV;
} cmsdk_uart_t;
#define CMSDK_UART(n) ((cmsdk_uart_t *)(0x40004000 + 0x1000 * (n)))

static inline void hw_uart_init(void) {
    for (int n = 1; n <= 3; n++) {
        CMSDK_UART(n)->BAUDDIV = 16;
        CMSDK_UART(n)->CTRL = 3;  // TX and RX enabled
    }
}

static inline int hw_uart_rx(int n) {  // a received byte, or -1
    return (CMSDK_UART(n)->STATE & 2) ? (int)(CMSDK_UART(n)->DATA & 0xff) : -1;
}

static inline int hw_uart_tx_busy(int n) {
    return CMSDK_UART(n)->STATE & 1;
}

static inline void hw_uart_tx(int n, uint8_t c) {
    CMSDK_UART(n)->DATA = c;
}

// APB timer 0, counting down from 0x3fffffff at 25 MHz (40 instructions a tick under -icount shift=0)
#define TIMER0 ((volatile uint32_t *)0x40000000)
static inline uint32_t hw_instructions(void) {
    if (!(TIMER0[0] & 1)) {
        TIMER0[2] = 0x3fffffff;  // reload
        TIMER0[1] = 0x3fffffff;  // value
        TIMER0[0] = 1;  // enable
    }
    return (0x3fffffff - TIMER0[1]) * 40;
}

#elif defined(QEMU_SOC_VIRT)

#define FLASH_BASE ((uint8_t *)0x81000000)
#define ROMFS_BASE ((uint8_t *)0x81800000)

static inline uint32_t semi(uint32_t num, const void *arg) {
    register uint32_t a0 __asm__ ("a0") = num;
    register const void *a1 __asm__ ("a1") = arg;
    __asm__ __volatile__ (
        ".option push\n"
        ".option norvc\n"  // the three must be 32-bit instructions, in one page
        ".balign 16\n"
        "slli zero, zero, 0x1f\n"
        "ebreak\n"
        "srai zero, zero, 7\n"
        ".option pop\n"
        : "+r" (a0) : "r" (a1) : "memory");
    return a0;
}

#define PCI_ECAM ((volatile uint32_t *)(0x30000000 + (2 << 15)))  // bus 0, slot 2, function 0
#define UART_IO ((volatile uint8_t *)(0x03000000 + 0x1000))  // its BAR0 in the PCIe I/O window
#define U16550(n, reg) (UART_IO[8 * ((n) - 1) + (reg)])

static inline void hw_uart_init(void) {
    PCI_ECAM[4] = 0x1000;  // BAR0 (I/O)
    PCI_ECAM[1] |= 1;  // command: I/O space on
    for (int n = 1; n <= 3; n++) {
        U16550(n, 1) = 0;  // no interrupts: polled
        U16550(n, 3) = 3;  // 8N1
        U16550(n, 2) = 0xc7;  // FIFOs on and cleared, receive trigger 14
    }
}

static inline int hw_uart_rx(int n) {
    return (U16550(n, 5) & 1) ? U16550(n, 0) : -1;
}

static inline int hw_uart_tx_busy(int n) {
    return !(U16550(n, 5) & 0x20);
}

static inline void hw_uart_tx(int n, uint8_t c) {
    U16550(n, 0) = c;
}

static inline uint32_t hw_instructions(void) {
    uint32_t n;
    __asm__ __volatile__ ("csrr %0, minstret" : "=r" (n));
    return n;
}

#else
#error "qboard: no hardware description for this machine"
#endif

#endif // QBOARD_HW_H
