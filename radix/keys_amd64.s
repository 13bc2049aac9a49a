//go:build !purego

#include "textflag.h"

// func chain64Blocks(out *uint64, n int, h uint64, raw *byte)
//
// chain64Go, block by block: acc = Σ_j fold(w[2j] ^ secret_j, w[2j+1] ^ c1)
// over the four 16-byte chunks, then h = fold(h ^ (64 + acc), c3), where
// fold(a, b) is the high word xor the low word of a·b (MULQ: DX:AX).
// Registers: DI out, CX blocks left, BX h, SI raw, R8 c1, R9 acc, R10 the
// second factor, R11-R13 the secrets of chunks 0-2; chunk 3's secret and
// c3 are read from chainK.
TEXT ·chain64Blocks(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ h+16(FP), BX
	MOVQ raw+24(FP), SI
	MOVQ $0xe7037ed1a0b428db, R8  // chainC1
	MOVQ $0xa0761d6478bd642f, R11 // chainC0
	MOVQ $0x2f32885515462b12, R12 // chainS1
	MOVQ $0xbdeef345b1cef1f5, R13 // chainS2

loop:
	MOVQ 0(SI), AX
	XORQ R11, AX
	MOVQ 8(SI), R10
	XORQ R8, R10
	MULQ R10
	XORQ DX, AX
	MOVQ AX, R9

	MOVQ 16(SI), AX
	XORQ R12, AX
	MOVQ 24(SI), R10
	XORQ R8, R10
	MULQ R10
	XORQ DX, AX
	ADDQ AX, R9

	MOVQ 32(SI), AX
	XORQ R13, AX
	MOVQ 40(SI), R10
	XORQ R8, R10
	MULQ R10
	XORQ DX, AX
	ADDQ AX, R9

	MOVQ 48(SI), AX
	XORQ chainK<>+0(SB), AX
	MOVQ 56(SI), R10
	XORQ R8, R10
	MULQ R10
	XORQ DX, AX
	ADDQ AX, R9

	ADDQ $64, R9
	XORQ R9, BX
	MOVQ chainK<>+8(SB), AX
	MULQ BX
	XORQ DX, AX
	MOVQ AX, BX
	MOVQ AX, 0(DI)
	ADDQ $64, SI
	ADDQ $8, DI
	DECQ CX
	JNZ  loop
	RET

DATA chainK<>+0(SB)/8, $0x4cab5e364e57b8d8 // chainS3
DATA chainK<>+8(SB)/8, $0x589965cc75374cc3 // chainC3
GLOBL chainK<>(SB), RODATA|NOPTR, $16
