"""The decode block's SASS mix counts the partial kernels' opcodes only, without modifiers or predicates (a
hand-written cuobjdump listing; no compile)."""

from benchmarks.sass_ll_partial import ALU_PIPE, FMA_PIPE, partial_mix

SASS = """
        code for sm_90a
                Function : kernel_cutlass__finish_kernel_abc
        /*0000*/                   FFMA R1, R2, R3, R4 ;                  /* 0x0 */
                Function : kernel_cutlass__partial_kernel_xyz
        /*0000*/                   LOP3.LUT R1, R2, 0xe000e00, RZ, 0xc0, !PT ;   /* 0x0 */
        /*0010*/                   SHF.L.U32 R3, R2, 0x9, RZ ;            /* 0x0 */
        /*0020*/               @P0 FFMA R4, R5, R6, R4 ;                  /* 0x0 */
        /*0030*/                   FFMA R4, R7, R8, R4 ;                  /* 0x0 */
        /*0040*/                   HADD2.F32 R9, -RZ, R10.H0_H0 ;         /* 0x0 */
"""


def test_partial_mix_counts_the_partial_kernel_only():
    mix = partial_mix(SASS)
    assert dict(mix) == {"LOP3": 1, "SHF": 1, "FFMA": 2, "HADD2": 1}
    assert {"LOP3", "SHF"} <= set(ALU_PIPE) and {"FFMA", "HADD2"} <= set(FMA_PIPE)
