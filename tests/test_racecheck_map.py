"""The racecheck report mapper (bench/racecheck_map.py), without a GPU: each read/write pair of a
report with its hazards summed over the launches that reported it, and the instruction at an
offset of a kernel in an nvdisasm listing. Synthetic text in the tools' formats."""

from bench import racecheck_map

REPORT = """========= COMPUTE-SANITIZER
========= Error: Race reported between Read access at maxsim_fwd_wgmma_fp32+0x49d0
=========     and Write access at maxsim_fwd_wgmma_fp32+0x8f70 [72 hazards]
=========
========= Error: Race reported between Read access at maxsim_fwd_wgmma_fp32+0x4a00
=========     and Write access at maxsim_fwd_wgmma_fp32+0x8f30 [8 hazards]
=========
========= Error: Race reported between Read access at maxsim_fwd_wgmma_fp32+0x49d0
=========     and Write access at maxsim_fwd_wgmma_fp32+0x8f70 [24 hazards]
========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)
"""

LISTING = """//--------------------- .text.maxsim_a --------------------------
.text.maxsim_a:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*49d0*/                   LDS.64 R16, [R20+0x35250] ;
//--------------------- .text.maxsim_b --------------------------
.text.maxsim_b:
        /*49d0*/                   STS.64 [R35+0x352f8], R12 ;
"""


def test_report_pairs_sum_each_pairs_hazards():
    assert racecheck_map.report_pairs(REPORT) == [
        (("maxsim_fwd_wgmma_fp32", "0x49d0", "0x8f70"), 96),
        (("maxsim_fwd_wgmma_fp32", "0x4a00", "0x8f30"), 8),
    ]


HAZARD_REPORT = """========= COMPUTE-SANITIZER
========= Error: Potential WAR hazard detected at __shared__ 0x32ce0 in block (88,0,0) :
=========     Read Thread (255,0,0) at maxsim_fwd_wgmma_fp32+0x45e0
=========     Write Thread (416,0,0) at maxsim_fwd_wgmma_fp32+0x83d0
=========     Current Value : 0, Incoming Value : 0
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
========= Error: Potential WAR hazard detected at __shared__ 0x32ce1 in block (88,0,0) :
=========     Read Thread (255,0,0) at maxsim_fwd_wgmma_fp32+0x45e0
=========     Write Thread (416,0,0) at maxsim_fwd_wgmma_fp32+0x83d0
=========
========= Error: Potential WAR hazard detected at __shared__ 0x32d00 in block (3,0,0) :
=========     Read Thread (250,0,0) at maxsim_fwd_wgmma_fp32+0x4610
=========     Write Thread (420,0,0) at maxsim_fwd_wgmma_fp32+0x8410
========= RACECHECK SUMMARY: 3 hazards displayed (9600 errors, 0 warnings)
"""


def test_report_pairs_of_a_hazard_report():
    """``--racecheck-report hazard`` (session 54's racecheck of the parts): each hazard shown
    counted once under its read/write pair."""
    assert racecheck_map.report_pairs(HAZARD_REPORT) == [
        (("maxsim_fwd_wgmma_fp32", "0x45e0", "0x83d0"), 2),
        (("maxsim_fwd_wgmma_fp32", "0x4610", "0x8410"), 1),
    ]


def test_instruction_of_a_kernel_at_an_offset():
    assert racecheck_map.instruction(LISTING, "maxsim_a", "0x49d0") == "LDS.64 R16, [R20+0x35250]"
    assert racecheck_map.instruction(LISTING, "maxsim_b", "0x49d0") == "STS.64 [R35+0x352f8], R12"
    assert racecheck_map.instruction(LISTING, "maxsim_c", "0x49d0") is None
