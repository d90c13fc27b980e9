"""The CUDA path: server-side training graphs fused with APOLLO's rules and FusionStitching's
block/warp composition, generated with TVM and compiled with nvcc.

    training graph ─legalize─▶ call_tir ops ─optype─▶ typed ops ─rules (Table 1)─▶ micro-graphs
        ─stitch (Table 2, shared-memory fit)─▶ groups ─fusion.outline_groups + FuseTIR─▶ kernels
        ─codegen (stitched: own schedule; others: dlight)─▶ CUDA source ─nvcc─▶ PTX / cubin
"""
