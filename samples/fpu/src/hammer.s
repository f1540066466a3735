// SPDX-License-Identifier: GPL-2.0
//
// fpu_hammer: keeps a pattern in the FPU registers and checks it, for the
// FPU tests. Shared by the `fpu` sample guest (in guest kernel and guest
// user mode) and by lguest_run_test (on the host), so that all of them
// hammer the same registers the same way. Intel syntax, position
// independent, no braces (it is pasted into global_asm! blocks that have
// operands).
//
// u64 fpu_hammer(u64 seed, u64 rounds, u64 flags, u64 spin)
//
// For each of `rounds` rounds: makes 65 quadwords from (seed, round) with
// an LCG; loads 16 XMM registers (YMM with flags bit 0: AVX) with 4
// quadwords each, the x87 stack with one integer, and MXCSR with a value
// whose rounding and flush-to-zero bits come from the seed; spins `spin`
// times (>= 1), letting interrupts and exits hit; stores it all back and
// compares. Returns the number of rounds in which anything changed.
//
// int fpu_has_avx(void): 1 if CPUID says AVX and OSXSAVE, and XCR0 has
// SSE and AVX state on.
    .balign 16
    .globl fpu_hammer
fpu_hammer:
    push rbx
    push rbp
    push r12
    push r13
    push r14
    push r15
    mov rbp, rsp
    sub rsp, 1216
    and rsp, -64
    mov r12, rdi
    mov r13, rsi
    mov r14, rdx
    mov r15, rcx
    xor ebx, ebx
.Lfh_round:
    test r13, r13
    jz .Lfh_done
    mov rax, r12
    shl rax, 32
    add rax, r13
    mov r8, 6364136223846793005
    mov r9, 1442695040888963407
    xor ecx, ecx
.Lfh_fill:
    imul rax, r8
    add rax, r9
    mov [rsp + rcx*8], rax
    inc ecx
    cmp ecx, 65
    jne .Lfh_fill
    // The x87 value: a 63-bit integer (exact in 64-bit extended precision).
    shr qword ptr [rsp + 512], 1
    mov eax, r12d
    and eax, 7
    shl eax, 13
    or eax, 0x1f80
    mov [rsp + 520], eax
    ldmxcsr [rsp + 520]
    fninit
    fild qword ptr [rsp + 512]
    test r14, 1
    jz .Lfh_load_sse
    vmovdqu ymm0, [rsp + 0]
    vmovdqu ymm1, [rsp + 32]
    vmovdqu ymm2, [rsp + 64]
    vmovdqu ymm3, [rsp + 96]
    vmovdqu ymm4, [rsp + 128]
    vmovdqu ymm5, [rsp + 160]
    vmovdqu ymm6, [rsp + 192]
    vmovdqu ymm7, [rsp + 224]
    vmovdqu ymm8, [rsp + 256]
    vmovdqu ymm9, [rsp + 288]
    vmovdqu ymm10, [rsp + 320]
    vmovdqu ymm11, [rsp + 352]
    vmovdqu ymm12, [rsp + 384]
    vmovdqu ymm13, [rsp + 416]
    vmovdqu ymm14, [rsp + 448]
    vmovdqu ymm15, [rsp + 480]
    jmp .Lfh_spin
.Lfh_load_sse:
    movdqu xmm0, [rsp + 0]
    movdqu xmm1, [rsp + 32]
    movdqu xmm2, [rsp + 64]
    movdqu xmm3, [rsp + 96]
    movdqu xmm4, [rsp + 128]
    movdqu xmm5, [rsp + 160]
    movdqu xmm6, [rsp + 192]
    movdqu xmm7, [rsp + 224]
    movdqu xmm8, [rsp + 256]
    movdqu xmm9, [rsp + 288]
    movdqu xmm10, [rsp + 320]
    movdqu xmm11, [rsp + 352]
    movdqu xmm12, [rsp + 384]
    movdqu xmm13, [rsp + 416]
    movdqu xmm14, [rsp + 448]
    movdqu xmm15, [rsp + 480]
.Lfh_spin:
    mov rcx, r15
.Lfh_spin_loop:
    dec rcx
    jnz .Lfh_spin_loop
    test r14, 1
    jz .Lfh_store_sse
    vmovdqu [rsp + 576], ymm0
    vmovdqu [rsp + 608], ymm1
    vmovdqu [rsp + 640], ymm2
    vmovdqu [rsp + 672], ymm3
    vmovdqu [rsp + 704], ymm4
    vmovdqu [rsp + 736], ymm5
    vmovdqu [rsp + 768], ymm6
    vmovdqu [rsp + 800], ymm7
    vmovdqu [rsp + 832], ymm8
    vmovdqu [rsp + 864], ymm9
    vmovdqu [rsp + 896], ymm10
    vmovdqu [rsp + 928], ymm11
    vmovdqu [rsp + 960], ymm12
    vmovdqu [rsp + 992], ymm13
    vmovdqu [rsp + 1024], ymm14
    vmovdqu [rsp + 1056], ymm15
    vzeroupper
    jmp .Lfh_stored
.Lfh_store_sse:
    movdqu [rsp + 576], xmm0
    movdqu [rsp + 608], xmm1
    movdqu [rsp + 640], xmm2
    movdqu [rsp + 672], xmm3
    movdqu [rsp + 704], xmm4
    movdqu [rsp + 736], xmm5
    movdqu [rsp + 768], xmm6
    movdqu [rsp + 800], xmm7
    movdqu [rsp + 832], xmm8
    movdqu [rsp + 864], xmm9
    movdqu [rsp + 896], xmm10
    movdqu [rsp + 928], xmm11
    movdqu [rsp + 960], xmm12
    movdqu [rsp + 992], xmm13
    movdqu [rsp + 1024], xmm14
    movdqu [rsp + 1056], xmm15
.Lfh_stored:
    fistp qword ptr [rsp + 576 + 512]
    stmxcsr [rsp + 576 + 520]
    mov eax, 0x1f80
    mov [rsp + 1152], eax
    ldmxcsr [rsp + 1152]
    // Compare: lanes 0-1 of each register (0-3 with AVX), the x87 value and
    // MXCSR.
    xor ecx, ecx
    xor edx, edx
.Lfh_cmp:
    mov rax, rcx
    and eax, 3
    cmp eax, 2
    jb .Lfh_cmp_lane
    test r14, 1
    jz .Lfh_cmp_next
.Lfh_cmp_lane:
    mov rax, [rsp + rcx*8]
    cmp rax, [rsp + 576 + rcx*8]
    je .Lfh_cmp_next
    inc edx
.Lfh_cmp_next:
    inc ecx
    cmp ecx, 64
    jne .Lfh_cmp
    mov rax, [rsp + 512]
    cmp rax, [rsp + 576 + 512]
    je 1f
    inc edx
1:  mov eax, [rsp + 520]
    cmp eax, [rsp + 576 + 520]
    je 1f
    inc edx
1:  test edx, edx
    jz 1f
    inc rbx
1:  dec r13
    jmp .Lfh_round
.Lfh_done:
    mov rax, rbx
    mov rsp, rbp
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbp
    pop rbx
    ret

    .balign 16
    .globl fpu_has_avx
fpu_has_avx:
    push rbx
    mov eax, 1
    xor ecx, ecx
    cpuid
    xor eax, eax
    mov edx, ecx
    and edx, 0x18000000
    cmp edx, 0x18000000
    jne 1f
    xor ecx, ecx
    xgetbv
    and eax, 6
    cmp eax, 6
    sete al
    movzx eax, al
1:  pop rbx
    ret
