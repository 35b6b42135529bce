"""What a training script uses: the datasets, the samplers, rank detection, the agreement check, the
Lightning module and the datasets fed by a meta server. Needs torch.

The top layer: imports every other sub-package, and none imports it.
"""
